//! Knob values given to a device from the library (`nuvec::tuning::configure`) over the
//! environment, in a process of their own: the CPU reads its knobs once, at its first kernel
//! choice, so this binary configures it before anything runs on it.

use nuvec::tuning::{configure, settings, Settings};
use nuvec::{Array, Device, Matrix};

#[test]
fn the_cpu_runs_with_the_settings_it_was_given_and_keeps_them() {
    // Scalar kernels, whatever the processor has and the environment says.
    let scalar = Settings::new().with("NUVEC_CPU_ISA", "scalar").unwrap();
    configure(Device::Cpu, scalar.clone()).unwrap();
    assert_eq!(settings(Device::Cpu), scalar);
    assert_eq!(nuvec::backends::cpu::kernel_isa().0, "scalar");

    // The kernels run: a product on the scalar path gives the plain sums (x · xᵀ).
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let y = x.linear(&Matrix::Dense(x.clone())).unwrap().to_f32_vec().unwrap();
    assert_eq!(y, [5.0, 11.0, 11.0, 25.0]);

    // Started: other settings are refused and change nothing; the same ones again are fine.
    let avx2 = Settings::new().with("NUVEC_CPU_ISA", "avx2").unwrap();
    let why = configure(Device::Cpu, avx2).unwrap_err().to_string();
    assert!(why.contains("cpu has already read its knobs") && why.contains("before loading"), "{why}");
    configure(Device::Cpu, scalar.clone()).unwrap();
    assert_eq!(settings(Device::Cpu), scalar);
    assert_eq!(nuvec::backends::cpu::kernel_isa().0, "scalar");

    // A GPU's knob is not the CPU's; a path is one per process.
    let pdl = Settings::new().with("NUVEC_PDL", "0").unwrap();
    assert!(configure(Device::Cpu, pdl).unwrap_err().to_string().contains("acts on cuda devices"));
    let cache = Settings::new().with("NUVEC_CACHE", "/tmp").unwrap_err().to_string();
    assert!(cache.contains("one per process"), "{cache}");
}
