//! Where a point lies against a shape. The boundary is its own answer
//! because containment counts it as inside while the cell grid and the
//! edge walk must tell it apart to decide a cell.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    Inside,
    Boundary,
    Outside,
}
