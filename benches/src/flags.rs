//! The benches' command-line flags: `--name value` pairs and bare `--name` switches, read from
//! the process's arguments (a bench target has no clap).

use std::str::FromStr;

/// The process's arguments.
#[derive(Debug)]
pub struct Flags(Vec<String>);

impl Flags {
    /// This process's arguments.
    pub fn from_env() -> Self {
        Flags(std::env::args().collect())
    }

    /// The value after `name`, parsed; `None` when absent or unparsable.
    pub fn value<T: FromStr>(&self, name: &str) -> Option<T> {
        self.raw(name)?.parse().ok()
    }

    /// The comma-separated list after `name` (its unparsable items left out).
    pub fn list<T: FromStr>(&self, name: &str) -> Option<Vec<T>> {
        Some(
            self.raw(name)?
                .split(',')
                .filter_map(|x| x.parse().ok())
                .collect(),
        )
    }

    /// The value after `name`, as given.
    pub fn raw(&self, name: &str) -> Option<&str> {
        let i = self.0.iter().position(|x| x == name)?;
        self.0.get(i + 1).map(String::as_str)
    }

    /// Whether `name` is given.
    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|x| x == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_lists_and_switches() {
        let f = Flags(
            ["bench", "--seconds", "1.5", "--sms", "8,x,16", "--json"]
                .map(String::from)
                .to_vec(),
        );
        assert_eq!(f.value::<f64>("--seconds"), Some(1.5));
        assert_eq!(f.list::<u32>("--sms"), Some(vec![8, 16]));
        assert_eq!(f.value::<u32>("--gap-us"), None);
        assert!(f.has("--json") && !f.has("--no-torch"));
        assert_eq!(f.value::<u32>("--json"), None, "a switch has no value");
    }
}
