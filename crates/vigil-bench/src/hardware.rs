//! What the benchmark ran on, recorded in every result file.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hardware {
    /// `model name` of /proc/cpuinfo, when readable.
    pub cpu_model: Option<String>,
    /// The `flags` line of /proc/cpuinfo: which kernels the engines could pick (absent in
    /// files written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_flags: Option<String>,
    /// Cores this process may use (`available_parallelism`).
    pub cores: usize,
    /// Logical processors listed in /proc/cpuinfo.
    pub logical_cpus: Option<usize>,
    pub os: String,
    pub arch: String,
    /// GPU name where one is detectable; this first cut records none.
    pub gpu: Option<String>,
}

impl Hardware {
    pub fn detect() -> Hardware {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok();
        let field = |line: &str| line.split_once(':').map(|(_, v)| v.trim().to_string());
        let cpu_model = cpuinfo.as_deref().and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(field)
        });
        let cpu_flags = cpuinfo.as_deref().and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("flags") || l.starts_with("Features"))
                .and_then(field)
        });
        let logical_cpus = cpuinfo
            .as_deref()
            .map(|c| c.lines().filter(|l| l.starts_with("processor")).count())
            .filter(|&n| n > 0);
        Hardware {
            cpu_model,
            cpu_flags,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            logical_cpus,
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
            gpu: None,
        }
    }
}
