//! The `crawl` example, built as a binary of the tests package so the
//! multi-process tests can start real replicas of it.

fn main() -> std::process::ExitCode {
    examples::crawl::main()
}
