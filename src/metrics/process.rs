//! The process's own families, read at scrape time: `pinboard_build_info` (which build runs) and
//! Prometheus' standard `process_*` set, with the names, help and meaning of client_golang's
//! process collector, from `/proc`. The parsers are pure (procfs text in, numbers out);
//! [`Process::read`] reads the files.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tracing::warn;

/// The git commit the build was made from, as `build.rs` found it (`unknown` outside a git
/// checkout, `-dirty` appended when tracked files had changes).
const COMMIT: &str = env!("PINBOARD_COMMIT");

/// What one scrape reports about the process.
#[derive(Debug)]
pub struct Process {
    /// `None` when `/proc` could not be read (logged): then only the build is reported.
    usage: Option<Usage>,
}

/// What the process uses, in Prometheus' units.
#[derive(Debug, PartialEq)]
struct Usage {
    stat: Stat,
    open_fds: u64,
    /// The soft `RLIMIT_NOFILE`; `unlimited` is `u64::MAX`, as client_golang reports it.
    max_fds: f64,
}

/// What `/proc/self/stat` says, in Prometheus' units.
#[derive(Debug, PartialEq)]
struct Stat {
    /// User and system time.
    cpu_seconds: f64,
    virtual_bytes: u64,
    resident_bytes: u64,
    /// Unix seconds.
    start_time_seconds: f64,
}

/// How `/proc/self/stat` counts time and memory: clock ticks per second, bytes per page.
struct Units {
    ticks: u64,
    page: u64,
}

impl Process {
    pub fn read() -> Process {
        let usage = Usage::read()
            .map_err(|e| warn!(error = %e, "reading /proc for the process metrics"))
            .ok();
        Process { usage }
    }
}

impl Usage {
    fn read() -> Result<Usage, String> {
        let read = |path: &str| std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"));
        let unexpected = |path: &str| format!("{path}: not as proc(5) describes it");
        // SAFETY: sysconf reads a configuration value; it touches no memory of ours.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let units = Units {
            ticks: u64::try_from(ticks).map_err(|_| "sysconf(_SC_CLK_TCK) failed")?,
            page: u64::try_from(page).map_err(|_| "sysconf(_SC_PAGESIZE) failed")?,
        };
        let boot = parse_boot_time(&read("/proc/stat")?).ok_or_else(|| unexpected("/proc/stat"))?;
        let stat = parse_stat(&read("/proc/self/stat")?, boot, &units)
            .ok_or_else(|| unexpected("/proc/self/stat"))?;
        let max_fds = parse_max_fds(&read("/proc/self/limits")?)
            .ok_or_else(|| unexpected("/proc/self/limits"))?;
        // The count includes the descriptor reading the directory, as client_golang's does.
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .map_err(|e| format!("/proc/self/fd: {e}"))?
            .count() as u64;
        Ok(Usage {
            stat,
            open_fds,
            max_fds,
        })
    }
}

/// `/proc/self/stat` (proc(5)): the times and sizes Prometheus reports. `boot_time` is the
/// machine's boot in unix seconds, which the start time (in ticks since boot) counts from.
fn parse_stat(text: &str, boot_time: u64, units: &Units) -> Option<Stat> {
    // The command name, in parentheses, may itself hold spaces and parentheses: the fields
    // start after the last `)`, with field 3 (the state).
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let seconds = |ticks: u64| ticks as f64 / units.ticks as f64;
    Some(Stat {
        cpu_seconds: seconds(field(14)? + field(15)?),
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * units.page,
        start_time_seconds: boot_time as f64 + seconds(field(22)?),
    })
}

/// The `btime` line of `/proc/stat`: when the machine booted, in unix seconds.
fn parse_boot_time(text: &str) -> Option<u64> {
    let line = text.lines().find_map(|l| l.strip_prefix("btime "))?;
    line.trim().parse().ok()
}

/// The soft limit of the `Max open files` line of `/proc/self/limits`.
fn parse_max_fds(text: &str) -> Option<f64> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    match line.split_whitespace().next()? {
        "unlimited" => Some(u64::MAX as f64),
        soft => soft.parse::<u64>().ok().map(|n| n as f64),
    }
}

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let build = ConstGauge::new(1i64);
        build.encode(
            encoder
                .encode_descriptor(
                    "pinboard_build_info",
                    "1, labelled with the version and git commit of the build this node runs",
                    None,
                    build.metric_type(),
                )?
                .encode_family(&[("version", env!("CARGO_PKG_VERSION")), ("commit", COMMIT)])?,
        )?;
        let Some(usage) = &self.usage else {
            return Ok(());
        };
        let cpu = ConstCounter::new(usage.stat.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                usage.stat.resident_bytes as f64,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                usage.stat.virtual_bytes as f64,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                usage.open_fds as f64,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                usage.max_fds,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                usage.stat.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process whose name holds a space and a parenthesis, 1.5 s of user and 0.25 s of
    /// system time (100 ticks a second), started 12.34 s after boot.
    const STAT: &str = "4242 (pin board) x) S 1 4242 4242 0 -1 4194560 2000 0 0 0 150 25 0 0 \
                        20 0 3 0 1234 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 4096 \
                        17926 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    const UNITS: Units = Units {
        ticks: 100,
        page: 4096,
    };

    #[test]
    fn stat_gives_times_and_sizes() {
        assert_eq!(
            parse_stat(STAT, 1_700_000_000, &UNITS),
            Some(Stat {
                cpu_seconds: 1.75,
                virtual_bytes: 104_857_600,
                resident_bytes: 2560 * 4096,
                start_time_seconds: 1_700_000_012.34,
            })
        );
        assert_eq!(parse_stat("4242 (short) S 1 2 3", 0, &UNITS), None);
        assert_eq!(parse_stat("no parenthesis", 0, &UNITS), None);
    }

    #[test]
    fn boot_time_is_the_btime_line() {
        let text = "cpu  10 0 20 300 0 0 0 0 0 0\nintr 1 2\nctxt 99\nbtime 1700000000\n\
                    processes 12\n";
        assert_eq!(parse_boot_time(text), Some(1_700_000_000));
        assert_eq!(parse_boot_time("cpu 1 2 3\n"), None);
    }

    #[test]
    fn max_fds_is_the_soft_open_files_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_fds(limits), Some(1024.0));
        let unlimited = limits.replace("1024 ", "unlimited ");
        assert_eq!(parse_max_fds(&unlimited), Some(u64::MAX as f64));
        assert_eq!(parse_max_fds("Max processes 10 10 processes\n"), None);
    }

    #[test]
    fn this_process_reads() {
        let usage = Usage::read().unwrap();
        assert!(usage.open_fds >= 3 && usage.max_fds >= usage.open_fds as f64);
        assert!(usage.stat.resident_bytes > 0);
        assert!(usage.stat.virtual_bytes >= usage.stat.resident_bytes);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = usage.stat.start_time_seconds;
        assert!(started <= now + 1.0 && started > now - 3600.0, "{started}");
    }
}
