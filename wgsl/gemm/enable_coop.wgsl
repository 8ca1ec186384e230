// First part of the cooperative-matrix expert-projection modules (GemmVariant::CoopF16): f16
// values in workgroup memory and wgpu's cooperative matrices.
enable f16;
enable wgpu_cooperative_matrix;
