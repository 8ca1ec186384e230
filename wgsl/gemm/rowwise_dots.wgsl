// The row-wise kernel's dot products for float weights (packed, native f16 or texture copies):
// group by group.
fn row_dots(xr: u32, wr: WeightAt) -> RowDots {
    return row_dots_by_group(xr, wr);
}
