//! Helpers shared by the facade's integration tests.

use std::net::SocketAddr;
use std::time::Duration;

/// `GET http://{addr}{path}` within `timeout`: the status and the body (of an error status too).
pub(crate) fn get(addr: SocketAddr, path: &str, timeout: Duration) -> (u16, String) {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    match agent.get(&format!("http://{addr}{path}")).call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("GET {path}: {e}"),
    }
}
