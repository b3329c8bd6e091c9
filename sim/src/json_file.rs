//! Reading the simulator's JSON inputs (cost models, machine descriptions) with errors that name
//! the file and what it should have been.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::error::{SimError, SimErrorKind, SimResult};

/// Reads `path` as JSON of a `T`; `what` names it in the error ("a cost model").
pub(crate) fn read<T: DeserializeOwned>(path: &Path, what: &str) -> SimResult<T> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        SimError::new(
            SimErrorKind::Io,
            format!("cannot read {}: {e}", path.display()),
        )
        .with_source(e)
    })?;
    serde_json::from_str(&text).map_err(|e| {
        SimError::new(
            SimErrorKind::Parse,
            format!("{}: not {what}: {e}", path.display()),
        )
        .with_source(e)
    })
}
