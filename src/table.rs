//! Plain-text tables for the client verbs: a header and rows in left-aligned columns two
//! spaces apart, as `ollama ps` and `docker ps` print them. Pure.

/// Columns as wide as their widest cell; no trailing spaces.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (cell, w) in cells.zip(&widths) {
            out.push_str(cell);
            out.extend(std::iter::repeat_n(' ', w - cell.chars().count() + 2));
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut header.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows = vec![
            vec!["smol".to_owned(), "ready".to_owned(), "4242".to_owned()],
            vec!["gemma-3-270m".to_owned(), "starting".to_owned(), "-".to_owned()],
        ];
        let t = render(&["NAME", "STATE", "PID"], &rows);
        assert_eq!(t, "NAME          STATE     PID\nsmol          ready     4242\ngemma-3-270m  starting  -\n");
        assert_eq!(render(&["A", "B"], &[]), "A  B\n");
    }
}
