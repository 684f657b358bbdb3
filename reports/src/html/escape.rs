//! HTML escaping: every string that came from a record or a path passes
//! through here before it reaches the page.

/// `text` with `&`, `<`, `>`, `"` and `'` replaced by entities, safe in
/// element content and in quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A string usable as an element id: letters, digits and `-` only.
pub fn id(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc(r#"<script>alert("a&b")</script>'"#),
            "&lt;script&gt;alert(&quot;a&amp;b&quot;)&lt;/script&gt;&#39;"
        );
        assert_eq!(id("all_reduce <x> & y"), "all-reduce-x-y");
    }
}
