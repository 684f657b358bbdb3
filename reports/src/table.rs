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

    /// Columns padded with spaces, a rule under the header.
    pub fn text(&self) -> String {
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

    /// A GitHub-flavoured Markdown table (pipes in cells escaped).
    pub fn markdown(&self) -> String {
        let cell = |c: &str| c.replace('|', "\\|");
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
}
