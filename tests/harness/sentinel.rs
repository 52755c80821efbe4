//! `RedisSentinel`: the Sentinel reports the master, and promotes the replica when it dies.

use std::time::Duration;

use redislimit_tests::RedisSentinel;

#[test]
fn sentinel_reports_the_master() {
    let deployment = RedisSentinel::start();
    assert_eq!(deployment.master_name(), "mymaster");
    assert_eq!(deployment.master_addr(), Some(deployment.master().addr()));
    let role = deployment.replica().command(&["ROLE"]);
    assert!(role.contains("slave"), "replica ROLE: {role:?}");
    let reply = deployment
        .sentinel()
        .command(&["SENTINEL", "get-master-addr-by-name", "mymaster"]);
    let port = deployment.master().port().to_string();
    assert_eq!(
        reply,
        format!("*2\r\n$9\r\n127.0.0.1\r\n${}\r\n{port}\r\n", port.len())
    );
}

#[test]
fn killing_the_master_promotes_the_replica() {
    let deployment = RedisSentinel::start();
    deployment.master().kill();
    deployment.wait_for_master(deployment.replica().addr(), Duration::from_secs(30));
    let role = deployment.replica().command(&["ROLE"]);
    assert!(
        role.starts_with("*3\r\n$6\r\nmaster\r\n"),
        "promoted replica ROLE: {role:?}"
    );
}
