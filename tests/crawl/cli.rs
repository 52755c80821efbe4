//! The command line's small promises, each checked by running the crawl.
