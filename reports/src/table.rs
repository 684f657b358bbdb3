//! Plain-text and Markdown tables for the terminal and CI summaries.

/// A table: a header and rows of cells; the first column is left-aligned,
/// the rest right-aligned (numbers).
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// Columns padded with spaces, a rule under the header; every cell
    /// as it may reach a terminal ([`terminal_text`]).
    pub fn text(&self) -> String {
        let safe = Table {
            header: self.header.iter().map(|c| terminal_text(c)).collect(),
            rows: self
                .rows
                .iter()
                .map(|r| r.iter().map(|c| terminal_text(c)).collect())
                .collect(),
        };
        safe.padded()
    }

    fn padded(&self) -> String {
        let cols = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(cols) {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, w) in widths.iter().enumerate() {
                let c = cells.get(i).map(String::as_str).unwrap_or("");
                let pad = w.saturating_sub(c.chars().count());
                if i > 0 {
                    s.push_str("  ");
                }
                if i == 0 {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                } else {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                }
            }
            s.trim_end().to_string() + "\n"
        };
        let mut out = line(&self.header);
        let total: usize = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }

    /// A GitHub-flavoured Markdown table, every cell escaped for Markdown
    /// ([`markdown_text`]).
    pub fn markdown(&self) -> String {
        let cell = markdown_text;
        let mut out = format!(
            "| {} |\n|{}\n",
            self.header
                .iter()
                .map(|h| cell(h))
                .collect::<Vec<_>>()
                .join(" | "),
            self.header
                .iter()
                .enumerate()
                .map(|(i, _)| if i == 0 { " --- |" } else { " ---: |" })
                .collect::<String>()
        );
        for r in &self.rows {
            out.push_str(&format!(
                "| {} |\n",
                r.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")
            ));
        }
        out
    }
}

/// `s` as Markdown shows it literally: a run id, a key or a folder name
/// can neither open a tag (`<img onerror=...>`), a link or emphasis, nor
/// end a table cell (`|`) or its row (a newline). HTML's three characters
/// become entities; those that open code, emphasis, links, strikethrough
/// or GitHub's math, and the backslash, are escaped with a backslash;
/// control characters are written as escapes.
pub fn markdown_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '\\' | '`' | '*' | '_' | '[' | ']' | '|' | '~' | '$' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// `s` as it may reach a terminal: every control character (an escape
/// sequence, a bell, a newline inside a cell) written as an escape, so
/// that a string from the records can neither drive the terminal nor
/// break a table's line.
pub fn terminal_text(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .flat_map(|c| {
            let mut e: Vec<char> = Vec::new();
            if c.is_control() {
                e.extend(c.escape_default());
            } else {
                e.push(c);
            }
            e
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_and_escapes() {
        let mut t = Table::new(["name", "value"]);
        t.row(["a|b", "1.0"]);
        t.row(["long name", "10.25"]);
        let text = t.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[2], "a|b          1.0", "{text}");
        assert_eq!(lines[3], "long name  10.25", "{text}");
        assert!(t.markdown().contains("| a\\|b | 1.0 |"));
    }

    #[test]
    fn hostile_cells_stay_text_in_markdown_and_on_a_terminal() {
        // Was: `report compare --markdown` copied run ids as they were.
        let mut t = Table::new(["run"]);
        t.row(["<img src=x onerror=alert(1)>|*x*\n[a](b)"]);
        t.row(["\u{1b}[31mred"]);
        let md = t.markdown();
        assert!(
            md.contains("&lt;img src=x onerror=alert(1)&gt;\\|\\*x\\*\\n\\[a\\](b)"),
            "{md}"
        );
        assert!(!md.contains('<') && !md.contains('\u{1b}'), "{md}");
        assert_eq!(md.lines().count(), 4, "{md}");
        let text = t.text();
        assert!(
            !text.contains('\u{1b}') && text.contains("\\u{1b}[31mred"),
            "{text}"
        );
    }
}
