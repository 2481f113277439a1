//! `nuvec --version` (and `-V`): the version, the build's features, and what the CPU kernels run
//! on this machine, as llama.cpp's tools print their build info.

/// The report, one fact a line.
pub fn text() -> String {
    let features = if cfg!(feature = "cuda") {
        "cuda (NVIDIA GPUs; libcuda and NVRTC are opened at run time)"
    } else {
        "none (CPU only; `cargo build --release -p nuvec-cli --features cuda` adds NVIDIA GPUs)"
    };
    let (isa, cpu_features) = nuvec::backends::cpu::kernel_isa();
    let listed = if cpu_features.is_empty() { "none listed".to_string() } else { cpu_features.join(" ") };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let int8 = if nuvec::backends::cpu::int8_activations() {
        "on (NUVEC_CPU_INT8_DOT=1)"
    } else {
        "off (f32; NUVEC_CPU_INT8_DOT=1 turns it on where AVX2 or AVX-512 VNNI is)"
    };
    format!(
        "nuvec {}\nfeatures: {features}\ncpu: {} kernels: {isa} (features: {listed})\nint8 activations: {int8}\ncores: {cores} (the CPU kernels' threads unless -t)\n",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
    )
}
