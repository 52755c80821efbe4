//! Redirects, penalties that must not starve other hosts, per-host order,
//! and stopping on a signal.
