//! Bounded text for messages and summaries: whatever the input, an error or a summary line stays
//! short (a 3,000,000-node graph or a 1,000-worker pool must not print megabytes).
//!
//! Self-contained (std only), so that the fuzz crate in `fuzz/` can compile it with the graph-file
//! reader without the rest of the package.

use std::fmt::{Display, Write as _};

/// How many items of a list a message or summary names before it says how many more there are.
pub const LIST_ITEMS: usize = 10;

/// Characters of one name (a node, a field, a graph) that a message quotes.
pub const NAME_CHARS: usize = 64;

/// Characters of a whole message (as [`clip_message`] bounds it).
pub const MESSAGE_CHARS: usize = 512;

/// `items` joined by `sep`, naming at most the first [`LIST_ITEMS`] and then `… (N more)`.
///
/// ```
/// use boundpool::bounded::list;
/// assert_eq!(list(0..3, ", "), "0, 1, 2");
/// assert_eq!(list(0..1000, ", "), "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, … (990 more)");
/// ```
pub fn list<I>(items: I, sep: &str) -> String
where
    I: IntoIterator,
    I::Item: Display,
{
    let mut out = String::new();
    let mut more = 0usize;
    for (i, item) in items.into_iter().enumerate() {
        if i >= LIST_ITEMS {
            more += 1;
            continue;
        }
        if i > 0 {
            out.push_str(sep);
        }
        let _ = write!(out, "{item}");
    }
    if more > 0 {
        let _ = write!(out, "{sep}… ({more} more)");
    }
    out
}

/// `name` cut to [`NAME_CHARS`] characters, with `… (N more chars)` when it was longer.
///
/// ```
/// use boundpool::bounded::name;
/// assert_eq!(name("short"), "short");
/// assert!(name(&"x".repeat(1000)).ends_with("… (936 more chars)"));
/// ```
pub fn name(name: &str) -> String {
    let mut chars = name.char_indices();
    match chars.nth(NAME_CHARS) {
        None => name.to_string(),
        Some((cut, _)) => {
            let more = name[cut..].chars().count();
            format!("{}… ({more} more chars)", &name[..cut])
        }
    }
}

/// `message` cut to about [`MESSAGE_CHARS`] characters: its start and its end (where serde
/// puts the line and column) are kept, the middle is replaced by `…`.
///
/// ```
/// use boundpool::bounded::clip_message;
/// assert_eq!(clip_message("short".into()), "short");
/// let long = format!("start {} end", "y".repeat(10_000));
/// let clipped = clip_message(long);
/// assert!(clipped.starts_with("start ") && clipped.ends_with(" end"));
/// assert!(clipped.chars().count() <= boundpool::bounded::MESSAGE_CHARS + 40);
/// ```
pub fn clip_message(message: String) -> String {
    let total = message.chars().count();
    if total <= MESSAGE_CHARS {
        return message;
    }
    let head = MESSAGE_CHARS * 3 / 4;
    let tail = MESSAGE_CHARS - head;
    let head_end = message.char_indices().nth(head).map_or(0, |(i, _)| i);
    let tail_start = message
        .char_indices()
        .nth(total - tail)
        .map_or(message.len(), |(i, _)| i);
    format!(
        "{} … ({} chars left out) … {}",
        &message[..head_end],
        total - head - tail,
        &message[tail_start..]
    )
}
