//! Knob values a program sets for one device ([`Settings`], [`configure`]), over the process's
//! environment: two models on two GPUs of one process can run with different kernels, matmul
//! precision or batching choices. A device reads its knobs once, when it starts (a GPU: its
//! first use; the CPU: its first kernel choice), so its settings are given before that.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::env::VarError;
use std::sync::{LazyLock, Mutex};

use super::{find, refusal, Knob};
use crate::{Device, Error, Result};

/// Knobs with one value per process, from the environment only: where files live, and the
/// kernels' compilation (the experiment macros, which host code also reads without a device, and
/// the compiled-kernel cache).
const PROCESS_WIDE: &[&str] = &[
    "NUVEC_CACHE",
    "NUVEC_DEFAULT_MODEL",
    "NUVEC_ALIGNED_CACHE",
    "NUVEC_NVRTC_DEFINES",
    "NUVEC_CUDA_KERNEL_CACHE",
    "NUVEC_DISTRIBUTED_TIMEOUT",
    "NUVEC_PIPELINE_MICRO_BATCHES",
];

/// Knob values for one device, each checked as `nuvec --help-env` describes it. Built with
/// [`Settings::set`] or parsed from `NAME=VALUE` lines, then handed to [`configure`].
///
/// ```
/// let settings = nuvec::tuning::Settings::new().with("NUVEC_CPU_ISA", "avx2").unwrap();
/// assert_eq!(settings.get("NUVEC_CPU_ISA"), Some("avx2"));
/// assert!(nuvec::tuning::Settings::new().with("NUVEC_CPU_ISA", "avx9").is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    values: BTreeMap<&'static str, String>,
}

impl Settings {
    /// No values: every knob as the environment (or its default) says.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets knob `name` to `value` (an empty value is the knob's default, whatever the
    /// environment says). An undeclared name, a knob that is one per process (paths), or a value
    /// the knob does not take is an error naming it.
    pub fn set(&mut self, name: &str, value: &str) -> Result<&mut Self> {
        let knob = settable(name)?;
        if let Some(why) = refusal(knob, value) {
            return Err(Error::Setting(why));
        }
        self.values.insert(knob.name, value.to_string());
        Ok(self)
    }

    /// [`Settings::set`], by value.
    pub fn with(mut self, name: &str, value: &str) -> Result<Self> {
        self.set(name, value)?;
        Ok(self)
    }

    /// Settings from lines of `NAME=VALUE` (blank lines and lines starting with `#` skipped), as a
    /// settings file or repeated command-line flags give them; the first bad line is the error.
    pub fn parse(text: &str) -> Result<Self> {
        let mut settings = Self::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let Some((name, value)) = line.split_once('=') else {
                return Err(Error::Setting(format!("knob setting {line:?} is not NAME=VALUE")));
            };
            settings.set(name.trim(), value.trim())?;
        }
        Ok(settings)
    }

    /// The value set for knob `name`, if any.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Every value set, by knob name.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.values.iter().map(|(k, v)| (*k, v.as_str()))
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// The declared knob `name`, if a device's settings may hold it.
fn settable(name: &str) -> Result<&'static Knob> {
    let knob = find(name)
        .ok_or_else(|| Error::Setting(format!("{name} is not a nuvec knob; `nuvec --help-env` lists them")))?;
    if PROCESS_WIDE.contains(&knob.name) {
        return Err(Error::Setting(format!("{name} is one per process: set it in the environment, not per device")));
    }
    Ok(knob)
}

/// Whether knob `k` acts on `device`.
fn acts_on(k: &Knob, device: Device) -> bool {
    match k.device {
        "cpu" => device == Device::Cpu,
        "cuda" => device != Device::Cpu,
        _ => true,
    }
}

/// Every device's settings, and the devices that have read theirs.
#[derive(Default)]
struct Registry {
    settings: HashMap<Device, Settings>,
    started: HashSet<Device>,
}

impl Registry {
    fn configure(&mut self, device: Device, settings: Settings) -> Result<()> {
        if let Some((name, _)) = settings.iter().find(|(name, _)| find(name).is_some_and(|k| !acts_on(k, device))) {
            let k = find(name).expect("checked above");
            return Err(Error::Setting(format!(
                "{name} acts on {} devices, not on {device}: give it to that device's settings",
                k.device
            )));
        }
        if self.started.contains(&device) && self.settings.get(&device).unwrap_or(&Settings::default()) != &settings {
            return Err(Error::Setting(format!(
                "{device} has already read its knobs (a device reads them once, when it starts): configure it \
                 before loading anything onto it"
            )));
        }
        self.settings.insert(device, settings);
        Ok(())
    }

    fn read(
        &mut self,
        device: Device,
        name: &str,
        environment: impl FnOnce() -> std::result::Result<String, VarError>,
    ) -> std::result::Result<String, VarError> {
        self.started.insert(device);
        match self.settings.get(&device).and_then(|s| s.get(name)) {
            Some(value) => Ok(value.to_string()),
            None => environment(),
        }
    }
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Gives `device` its knob values over the environment's. Refused when a value names a knob
/// of another device kind, or when the device has already read its knobs (a GPU starts at its
/// first use, the CPU at its first kernel choice: configure before loading a model onto it)
/// unless the settings are the ones it has.
pub fn configure(device: Device, settings: Settings) -> Result<()> {
    registry().configure(device, settings)
}

/// The settings given to `device` ([`configure`]); empty when none were.
pub fn settings(device: Device) -> Settings {
    registry().settings.get(&device).cloned().unwrap_or_default()
}

/// Knob `name`'s value for `device`: its [`configure`]d setting, else the environment's
/// ([`super::env`]). Marks the device as started: its settings are fixed from here on.
pub fn setting(name: &str, device: Device) -> std::result::Result<String, VarError> {
    debug_assert!(find(name).is_some(), "{name} is not declared in nuvec::tuning::KNOBS");
    registry().read(device, name, || std::env::var(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_refuse_what_a_device_cannot_take() {
        let err = |r: Result<Settings>| r.unwrap_err().to_string();
        assert!(err(Settings::new().with("NUVEC_PDL", "off")).contains("NUVEC_PDL=\"off\""));
        assert!(err(Settings::new().with("NUVEC_NOPE", "1")).contains("not a nuvec knob"));
        assert!(err(Settings::new().with("NUVEC_CACHE", "/tmp/x")).contains("one per process"));
        assert!(err(Settings::parse("NUVEC_PDL 0")).contains("not NAME=VALUE"));
        let parsed = Settings::parse("# a comment\n\nNUVEC_PDL = 0\nNUVEC_BATCH_PIPELINE=1\n").unwrap();
        assert_eq!(parsed.iter().collect::<Vec<_>>(), [("NUVEC_BATCH_PIPELINE", "1"), ("NUVEC_PDL", "0")]);
    }

    #[test]
    fn a_device_reads_its_settings_over_the_environment_and_keeps_them() {
        let mut r = Registry::default();
        let cpu = Settings::new().with("NUVEC_CPU_ISA", "scalar").unwrap().with("NUVEC_BATCH_PIPELINE", "1").unwrap();
        let env = |v: &'static str| move || Ok::<String, VarError>(v.to_string());
        // A CUDA knob is not the CPU's.
        let wrong = Settings::new().with("NUVEC_PDL", "0").unwrap();
        assert!(r.configure(Device::Cpu, wrong).unwrap_err().to_string().contains("acts on cuda devices"));
        r.configure(Device::Cpu, cpu.clone()).unwrap();
        assert_eq!(r.read(Device::Cpu, "NUVEC_CPU_ISA", env("avx2")).unwrap(), "scalar");
        // Unset there: the environment's value, or its absence.
        assert_eq!(r.read(Device::Cpu, "NUVEC_CPU_INT8_DOT", env("1")).unwrap(), "1");
        assert!(r.read(Device::Cpu, "NUVEC_CPU_INT8_DOT", || Err(VarError::NotPresent)).is_err());
        // Started: the same settings again are fine, others are refused and change nothing.
        r.configure(Device::Cpu, cpu.clone()).unwrap();
        let why = r.configure(Device::Cpu, Settings::new()).unwrap_err().to_string();
        assert!(why.contains("cpu has already read its knobs"), "{why}");
        assert_eq!(r.read(Device::Cpu, "NUVEC_BATCH_PIPELINE", env("0")).unwrap(), "1");
        // An empty value is the knob's default, whatever the environment says.
        let mut r = Registry::default();
        r.configure(Device::Cpu, Settings::new().with("NUVEC_CPU_ISA", "").unwrap()).unwrap();
        assert_eq!(r.read(Device::Cpu, "NUVEC_CPU_ISA", env("scalar")).unwrap(), "");
    }
}
