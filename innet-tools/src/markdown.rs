//! The reports' markdown tables, laid out by `tabled`: a header naming each column and its
//! alignment, then rows of cells; the columns padded to one width, so the raw report reads
//! as a table too. (`tabled`'s markdown style draws no alignment colons: they are written
//! into its separator line here, so a renderer right-aligns numbers as GitHub shows them.)

use std::fmt;

use tabled::{
    builder::Builder,
    settings::{Alignment, Style, object::Columns},
};

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A markdown table being filled row by row.
#[derive(Default)]
pub struct Table {
    builder: Builder,
    align: Vec<Align>,
}

impl Table {
    /// A table with these columns: the first left-aligned (the row's name), the others
    /// right-aligned (numbers).
    #[must_use]
    pub fn numbers<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self::aligned(header.into_iter().enumerate().map(|(k, name)| {
            let align = if k == 0 { Align::Left } else { Align::Right };
            (name, align)
        }))
    }

    /// A table with these columns, each with its alignment.
    #[must_use]
    pub fn aligned<S: Into<String>>(columns: impl IntoIterator<Item = (S, Align)>) -> Self {
        let mut t = Self::default();
        let (names, align): (Vec<String>, Vec<Align>) =
            columns.into_iter().map(|(n, a)| (n.into(), a)).unzip();
        t.builder.push_record(names);
        t.align = align;
        t
    }

    /// Adds a row (as many cells as columns; fewer are left empty).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Self {
        let mut cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        cells.resize(self.align.len().max(cells.len()), String::new());
        self.builder.push_record(cells);
        self
    }
}

impl fmt::Display for Table {
    /// The table, each line ended with a newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut table = self.builder.clone().build();
        table.with(Style::markdown());
        for (k, a) in self.align.iter().enumerate() {
            if *a == Align::Right {
                table.modify(Columns::one(k), Alignment::right());
            }
        }
        let text = table.to_string();
        for (n, line) in text.lines().enumerate() {
            if n == 1 {
                writeln!(f, "{}", self.separator(line))?;
            } else {
                writeln!(f, "{line}")?;
            }
        }
        Ok(())
    }
}

impl Table {
    /// The header's separator line with the alignment colons: `|-----:|` for a right-
    /// aligned column (same width).
    fn separator(&self, line: &str) -> String {
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        let marked: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(k, c)| match self.align.get(k) {
                Some(Align::Right) if c.len() > 1 => format!("{}:", &c[..c.len() - 1]),
                _ => (*c).to_owned(),
            })
            .collect();
        format!("|{}|", marked.join("|"))
    }
}

/// A rendered table's rows with the padding squeezed out (`| a | b |`), for tests and
/// readers that look for a row's cells.
#[must_use]
pub fn squeezed(table: &str) -> String {
    table
        .lines()
        .map(|l| {
            if !l.starts_with('|') {
                return l.to_owned();
            }
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            format!("| {} |", cells.join(" | "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_numbers_align_right() {
        let mut t = Table::numbers(["bytes", "host-rd", "inc-node"]);
        t.row(["4", "120.1", "45.2 (2.66×)"]);
        t.row(["1024", "300.5", "99.0"]);
        assert_eq!(
            t.to_string(),
            "| bytes | host-rd |     inc-node |\n\
             |-------|--------:|-------------:|\n\
             | 4     |   120.1 | 45.2 (2.66×) |\n\
             | 1024  |   300.5 |         99.0 |\n"
        );
    }

    #[test]
    fn a_short_row_is_filled_and_squeezing_gives_the_cells() {
        let mut t = Table::aligned([("what", Align::Left), ("note", Align::Left)]);
        t.row(["only"]);
        let s = squeezed(&t.to_string());
        assert!(s.contains("| what | note |"), "{s}");
        assert!(s.contains("| only |  |"), "{s}");
    }
}
