//! Tests of the test harness itself: the Redis processes it starts behave as promised.

mod cluster;
mod sentinel;
mod standalone;
