//! The GPU tests' shared helpers live in the `boundpool-test-support` crate (the GPU guard, the
//! test pools, `os_threads`, the spin node); this shim keeps `mod common;` working for a test
//! file written against the old module. New files: `use boundpool_test_support::...`.
#![allow(unused_imports, unreachable_pub)]

pub use boundpool_test_support::*;
