//! The benches' command lines, on clap: each bench declares its flags as a `clap::Parser` and
//! reads them with [`parse`], which drops the `--bench` that `cargo bench` adds to a bench
//! target's arguments. A misspelt flag or a value that does not parse is an error naming it
//! (exit status 2), not a default taken silently.

use std::ffi::OsString;

/// This process's flags, as `T` declares them (`--help` lists them).
pub fn parse<T: clap::Parser>() -> T {
    parse_from(std::env::args_os())
}

/// [`parse`] of `args` (the program's name first).
pub fn parse_from<T: clap::Parser>(args: impl IntoIterator<Item = impl Into<OsString>>) -> T {
    T::parse_from(args.into_iter().map(Into::into).filter(|a| a != "--bench"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug)]
    struct Flags {
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, value_delimiter = ',', default_values_t = [8, 16])]
        sms: Vec<u32>,
        #[arg(long)]
        json: bool,
        #[arg(long = "no-torch", action = clap::ArgAction::SetFalse)]
        torch: bool,
    }

    #[test]
    fn values_lists_and_switches_with_cargo_bench_s_flag_dropped() {
        let f: Flags = parse_from([
            "bench",
            "--bench",
            "--seconds",
            "1.5",
            "--sms",
            "8,32",
            "--json",
        ]);
        assert_eq!(
            (f.seconds, f.sms, f.json, f.torch),
            (1.5, vec![8, 32], true, true)
        );
        let f: Flags = parse_from(["bench", "--no-torch"]);
        assert_eq!(
            (f.seconds, f.sms, f.json, f.torch),
            (2.0, vec![8, 16], false, false)
        );
        let bad = <Flags as clap::Parser>::try_parse_from(["bench", "--sms", "8,x"]);
        assert!(bad.unwrap_err().to_string().contains("'x'"));
    }
}
