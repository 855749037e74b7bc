//! The index's arena of part-grid cells, two bits per cell.
//!
//! At 10k fences 70% of a candidate test's samples sat on the cell's load,
//! most likely a miss into an arena of 12.7 MB at one byte per cell (this
//! VM has no counters to say which level). A cell holds one of three
//! answers, so two bits carry it, and the same grids take a quarter of the
//! bytes and of the pages.

use super::cell_grid::Cell;
use super::prefetch::prefetch;

/// Holds `len.div_ceil(4)` bytes: a byte is pushed with its first cell.
#[derive(Debug, Default)]
pub struct PackedCells {
    bytes: Vec<u8>,
    len: usize,
}

impl PackedCells {
    /// How many cells are held (the next cell's index).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Appends a grid's cells; the first takes index [`Self::len`].
    pub fn extend(&mut self, cells: &[Cell]) {
        self.bytes
            .reserve((self.len + cells.len()).div_ceil(4) - self.bytes.len());
        for &cell in cells {
            let (byte, shift) = (self.len / 4, 2 * (self.len % 4));
            if shift == 0 {
                self.bytes.push(0);
            }
            self.bytes[byte] |= (cell as u8) << shift;
            self.len += 1;
        }
    }

    /// Starts loading the byte that holds the cell at `index`.
    #[inline]
    pub fn prefetch(&self, index: usize) {
        if let Some(byte) = self.bytes.get(index / 4) {
            prefetch(byte);
        }
    }

    /// The cell at `index`; panics past the end, as a slice does.
    #[inline]
    pub fn get(&self, index: usize) -> Cell {
        assert!(index < self.len, "cell {index} of {}", self.len);
        match (self.bytes[index / 4] >> (2 * (index % 4))) & 0b11 {
            0 => Cell::Outside,
            1 => Cell::Inside,
            // Never written; were it read, the edges would still answer.
            _ => Cell::Edge,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cell(v: u8) -> Cell {
        [Cell::Outside, Cell::Inside, Cell::Edge][usize::from(v % 3)]
    }

    proptest! {
        /// Grids appended one after another, at any offset within a byte,
        /// read back cell for cell.
        #[test]
        fn every_cell_reads_back_as_appended(
            grids in prop::collection::vec(prop::collection::vec(0u8..3, 0..40), 0..8),
        ) {
            let mut packed = PackedCells::default();
            let mut plain = Vec::new();
            for grid in &grids {
                let cells: Vec<Cell> = grid.iter().copied().map(cell).collect();
                prop_assert_eq!(packed.len(), plain.len());
                packed.extend(&cells);
                plain.extend(cells);
            }
            prop_assert_eq!(packed.len(), plain.len());
            for (i, &c) in plain.iter().enumerate() {
                prop_assert_eq!(packed.get(i), c);
            }
        }
    }

    #[test]
    #[should_panic(expected = "cell 5 of 5")]
    fn a_read_past_the_end_panics_like_a_slice() {
        let mut packed = PackedCells::default();
        packed.extend(&[Cell::Inside; 5]);
        packed.get(5);
    }
}
