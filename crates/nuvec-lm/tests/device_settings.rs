//! The Batcher's and `generate`'s defaults read from a device's settings
//! (`nuvec::tuning::configure`) over the environment, in a process of their own (a device reads
//! its knobs once).

use nuvec::tuning::{configure, Settings};
use nuvec::Device;

#[test]
fn batching_defaults_follow_the_device_s_settings() {
    // On the CPU both are off unless asked for (the CI's environment sets neither).
    let on = Settings::parse("NUVEC_DEVICE_SAMPLING=1\nNUVEC_BATCH_PIPELINE=1\n").unwrap();
    configure(Device::Cpu, on).unwrap();
    assert!(nuvec_lm::device_sampling_default(Device::Cpu).unwrap());
    assert!(nuvec_lm::pipeline_default(Device::Cpu).unwrap());
    // Read: the CPU's settings are fixed now.
    let off = Settings::new().with("NUVEC_DEVICE_SAMPLING", "0").unwrap();
    assert!(configure(Device::Cpu, off).is_err());
    assert!(nuvec_lm::device_sampling_default(Device::Cpu).unwrap());
}
