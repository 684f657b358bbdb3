//! Text for a person at a terminal: prose broken into short lines.

/// The longest line a report's first screen prints, in characters (a
/// table may be wider only where a cell from the records is).
pub const WIDTH: usize = 100;

/// `text` broken at spaces into lines of at most `width` characters (a
/// word longer than that stays whole), the first begun with `first`, the
/// others with `rest`; each ends in a newline.
pub fn wrap_hanging(text: &str, first: &str, rest: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !empty && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(&line);
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// `text` broken into lines of at most `width` characters, each begun
/// with `indent`.
pub fn wrap(text: &str, indent: &str, width: usize) -> String {
    wrap_hanging(text, indent, indent, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn longest(text: &str) -> usize {
        text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
    }

    #[test]
    fn prose_breaks_at_spaces_within_the_width() {
        let text = "one two three four five six seven eight nine ten";
        let out = wrap_hanging(text, "  ", "    ", 16);
        assert!(longest(&out) <= 16, "{out}");
        assert!(out.starts_with("  one two three\n    four"), "{out}");
        assert_eq!(out.split_whitespace().collect::<Vec<_>>().join(" "), text);
        // A word longer than the width stays whole, on its own line.
        assert_eq!(wrap("a abcdefghij b", "", 5), "a\nabcdefghij\nb\n");
        assert_eq!(wrap("short", "  ", 100), "  short\n");
    }
}
