//! `observe::install_prometheus` failing (a global recorder is already installed) leaves nothing
//! running: its port can be bound again at once and no listener thread or task is left. Its own
//! test binary: it installs the process's global recorder.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn listener_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim().starts_with("boundpool-prom"))
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_failed_install_leaves_no_listener_and_frees_the_port() {
    let _first = boundpool::observe::install_prometheus_recorder().expect("the first recorder");

    // Off a runtime: the listener would get a thread of its own.
    let addr = free_port();
    let e = boundpool::observe::install_prometheus(addr).expect_err("a recorder is installed");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
    TcpListener::bind(addr)
        .unwrap_or_else(|e| panic!("port {addr} still bound after the error: {e}"));
    assert_eq!(listener_threads(), 0, "a listener thread was left running");

    // Inside a runtime: the listener would be a task of it.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let addr = free_port();
    rt.block_on(async {
        let e = boundpool::observe::install_prometheus(addr).expect_err("a recorder is installed");
        assert!(e.to_string().contains("recorder"), "{e}");
        // Let a spawned task (if any) start and take the socket.
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    TcpListener::bind(addr)
        .unwrap_or_else(|e| panic!("port {addr} still bound after the error: {e}"));
}
