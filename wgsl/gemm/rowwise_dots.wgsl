// The row-wise kernel's dot products for f16 and texture weights: group by group.
fn row_dots(xr: u32, wr: WeightAt) -> RowDots {
    return row_dots_by_group(xr, wr);
}
