//! Picks free loopback ports for the servers the harness starts.

use std::net::TcpListener;

/// Highest port whose Redis Cluster bus port (`port + 10000`) still fits in a `u16`.
const MAX_CLUSTER_PORT: u16 = u16::MAX - 10_000;

/// A loopback port that was free a moment ago: bound to port 0, read back, released.
///
/// Another process may take it before our server binds it; callers retry with a fresh
/// port when the server reports `Address already in use`. With `cluster_bus`, the port is
/// at most 55535 and `port + 10000` (the Cluster bus) was free as well.
pub(crate) fn free_port(cluster_bus: bool) -> u16 {
    for _ in 0..1000 {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .unwrap_or_else(|e| panic!("cannot bind a loopback port to find a free one: {e}"));
        let port = listener
            .local_addr()
            .expect("bound listener has an address")
            .port();
        if !cluster_bus {
            return port;
        }
        if port <= MAX_CLUSTER_PORT && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("found no free loopback port (with a free Cluster bus port) in 1000 tries");
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::free_port;

    #[test]
    fn free_ports_can_be_bound() {
        let port = free_port(false);
        TcpListener::bind(("127.0.0.1", port)).expect("port is free");
    }

    #[test]
    fn cluster_ports_leave_room_for_the_bus() {
        for _ in 0..20 {
            let port = free_port(true);
            assert!(port <= 55_535, "port {port} has no room for its bus port");
        }
    }
}
