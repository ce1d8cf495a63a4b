//! A capture run as asked for, before any system access: the command line
//! and the config file turned into checked values (ripgrep's flags → low
//! args → high args). Pure but for reading the config file; unit-tested.

pub mod conditions;
pub mod config;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use agent_common::DEFAULT_RING_BYTES;

use crate::{
    capture::disk_budget::{BudgetScope, DiskBudget},
    error::Failure,
    flags::{
        defs::{DEFAULT_COOLDOWN, RunArgs, TriggerOptions},
        parse::{parse_duration, parse_rate, parse_size},
    },
    perf::{
        args::check_perf_args,
        record::{Recording, ring_pages},
    },
    plan::conditions::{Filters, trigger_config},
    symbols::Query,
};

/// perf's sampling frequency unless told otherwise, Hz.
pub const DEFAULT_FREQ: u32 = 999;
/// `--max-targets` unless told otherwise.
pub const DEFAULT_MAX_TARGETS: u64 = 8;

/// What one trigger watches, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchArg {
    Pid(i32),
    Exe(PathBuf),
}

/// One trigger, as given on the command line or in a config file, checked.
#[derive(Debug, Clone)]
pub struct TriggerPlan {
    /// Its output subdirectory in a config run.
    pub name: String,
    pub watch: WatchArg,
    pub query: Query,
    pub wait_for_symbol: Option<Duration>,
    pub filters: Filters,
    pub use_uretprobe: bool,
    /// `--probe-rets`: never choose the uretprobe by proof.
    pub probe_rets: bool,
    /// `--always-armed`: never detach the uprobes during a cooldown.
    pub always_armed: bool,
    /// A `--pid` trigger also counts the calls of processes forked from
    /// its target (on unless `--no-follow-forks`; off for `--exe`).
    pub follow_forks: bool,
    /// The off-CPU breakdown (`--off-cpu`, on by default with
    /// `--slower-than`): the window before a hit without a duration.
    pub off_cpu: Option<Duration>,
    pub after: Option<Duration>,
    pub max_snapshots: Option<u64>,
}

/// Settings shared by every trigger of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSettings {
    pub output: Option<PathBuf>,
    /// Write each run into a new `<output>/<local time>/` (config runs, so
    /// that a restarted service never meets its previous output).
    pub dated_output: bool,
    pub perf: Option<PathBuf>,
    pub event: Option<String>,
    pub freq: u32,
    pub keep: Option<u32>,
    pub perf_args: Vec<String>,
    pub max_targets: u64,
    /// How perf keeps samples between snapshots.
    pub recording: Recording,
    /// The flight-recorder ring size was given (not the default).
    pub flight_ring_given: bool,
    /// Disk budget, and what it covers.
    pub max_disk: Option<DiskBudget>,
    /// `--upload*` or `[upload]`.
    pub upload: Option<crate::upload::UploadPlan>,
}

/// Size of each flight-recorder ring unless told otherwise, bytes: at 999 Hz
/// a sample with perf's deepest default stack (127 frames) is about 1 KiB, so
/// one busy CPU fills ~1 MB/s and 2 MiB holds about two seconds
/// (docs/flight-recorder.md).
pub const DEFAULT_FLIGHT_RING: u64 = 2 << 20;

/// Chooses the recording mode: `--continuous`/`--flight-recorder` (or the
/// config's `recording`) win; otherwise `--pid` runs record continuously and
/// `--exe` and `--config` runs use the flight recorder (GUIDE.md, "Recording").
fn recording_mode(
    flight: bool,
    continuous: bool,
    named: Option<&str>,
    pid_run: bool,
    ring: Option<u64>,
) -> Result<Recording, Failure> {
    let flight = match (flight, continuous, named) {
        (true, _, _) => true,
        (_, true, _) => false,
        (_, _, Some("flight-recorder")) => true,
        (_, _, Some("continuous")) => false,
        (_, _, Some(other)) => {
            return Err(Failure::usage(format!(
                "recording = {other:?}: use \"flight-recorder\" or \"continuous\""
            )));
        }
        (_, _, None) => !pid_run,
    };
    if !flight {
        if ring.is_some() {
            return Err(Failure::usage(
                "--flight-ring applies to the flight recorder; add --flight-recorder or drop it",
            ));
        }
        return Ok(crate::perf::record::Recording::Continuous);
    }
    Ok(crate::perf::record::Recording::FlightRecorder {
        ring_pages: ring_pages(ring.unwrap_or(DEFAULT_FLIGHT_RING)),
    })
}

/// A config file's size field, checked.
fn config_size(field: &str, value: Option<&str>) -> Result<Option<u64>, Failure> {
    value
        .map(|v| parse_size(v).map_err(|e| Failure::usage(format!("bad {field}: {e}"))))
        .transpose()
}

/// A run's plan.
#[derive(Debug, Clone)]
pub struct Plan {
    pub settings: RunSettings,
    pub triggers: Vec<TriggerPlan>,
    /// The triggers come from `--config`.
    pub from_config: bool,
    /// Size of the hit ring buffer, bytes.
    pub ring_bytes: u32,
}

/// Builds the plan of a run and checks everything that needs no system
/// access. Errors (exit code 2): an unreadable or bad config file, bad
/// extra perf arguments, a bad `--ring-bytes`, a bad `--when`, too many
/// `--when` or `--tid`.
pub fn plan(args: &RunArgs) -> Result<Plan, Failure> {
    let (settings, triggers) = match &args.config {
        Some(path) => from_config(path, args)?,
        None => from_cli(args)?,
    };
    check_perf_args(&settings.perf_args).map_err(Failure::usage)?;
    let ring_bytes = args.ring_bytes.unwrap_or(DEFAULT_RING_BYTES);
    if !ring_bytes.is_power_of_two() || ring_bytes < 4096 {
        return Err(Failure::usage(
            "--ring-bytes must be a power of two of at least 4096",
        ));
    }
    for t in &triggers {
        trigger_config(&t.filters, false)?;
    }
    Ok(Plan {
        settings,
        triggers,
        from_config: args.config.is_some(),
        ring_bytes,
    })
}

impl Plan {
    /// A `--pid` run: one trigger, one recorder, whose end is the run's.
    pub fn single_pid_run(&self) -> bool {
        !self.from_config && matches!(self.triggers[0].watch, WatchArg::Pid(_))
    }

    /// The run's output directory; `timestamp` is the local time
    /// (`YYYYmmdd-HHMMSS`) for the default name and for config runs.
    pub fn output_dir(&self, timestamp: &str) -> PathBuf {
        match &self.settings.output {
            Some(o) if self.settings.dated_output => o.join(timestamp),
            Some(o) => o.clone(),
            None => PathBuf::from(format!(
                "mt-agent-{}-{timestamp}",
                match &self.triggers[0].watch {
                    WatchArg::Pid(pid) => pid.to_string(),
                    WatchArg::Exe(p) => p
                        .file_name()
                        .map_or("exe".into(), |n| n.to_string_lossy().into_owned()),
                }
            )),
        }
    }

    /// A trigger's output directory inside the run's: the run's own, or a
    /// subdirectory named after the trigger in a config run.
    pub fn trigger_dir(&self, run_dir: &Path, t: &TriggerPlan) -> PathBuf {
        if self.from_config {
            run_dir.join(&t.name)
        } else {
            run_dir.to_path_buf()
        }
    }
}

fn from_cli(args: &RunArgs) -> Result<(RunSettings, Vec<TriggerPlan>), Failure> {
    let t = trigger_plan(&args.trigger, "trigger0".into())?;
    let s = RunSettings {
        output: args.output.clone(),
        dated_output: false,
        perf: args.perf.clone(),
        event: args.event.clone(),
        freq: args.freq.unwrap_or(DEFAULT_FREQ),
        keep: args.keep,
        perf_args: args.perf_args.clone(),
        max_targets: args.max_targets.unwrap_or(DEFAULT_MAX_TARGETS),
        flight_ring_given: args.flight_ring.is_some(),
        recording: recording_mode(
            args.flight_recorder,
            args.continuous,
            None,
            args.trigger.pid.is_some(),
            args.flight_ring,
        )?,
        max_disk: args.max_disk.map(|bytes| DiskBudget {
            bytes,
            scope: BudgetScope::Run,
        }),
        upload: upload_plan(args, None)?,
    };
    Ok((s, vec![t]))
}

fn from_config(path: &Path, args: &RunArgs) -> Result<(RunSettings, Vec<TriggerPlan>), Failure> {
    let c = config::load(path)?;
    let triggers = c
        .triggers
        .iter()
        .map(|t| trigger_plan(t, t.name.clone().unwrap_or_default()))
        .collect::<Result<_, _>>()?;
    let s = RunSettings {
        // What the command line says wins over the file.
        output: args.output.clone().or(c.output),
        dated_output: true,
        perf: args.perf.clone().or(c.perf),
        event: args.event.clone().or(c.event),
        freq: args.freq.or(c.freq).unwrap_or(DEFAULT_FREQ),
        keep: args.keep.or(c.keep),
        perf_args: if args.perf_args.is_empty() {
            c.perf_args
        } else {
            args.perf_args.clone()
        },
        max_targets: args
            .max_targets
            .or(c.max_targets)
            .unwrap_or(DEFAULT_MAX_TARGETS),
        flight_ring_given: args.flight_ring.is_some() || c.flight_ring.is_some(),
        recording: recording_mode(
            args.flight_recorder,
            args.continuous,
            c.recording.as_deref(),
            false,
            args.flight_ring
                .or(config_size("flight_ring", c.flight_ring.as_deref())?),
        )?,
        // The command line bounds this run; the file bounds the output root.
        max_disk: match args.max_disk {
            Some(bytes) => Some(DiskBudget {
                bytes,
                scope: BudgetScope::Run,
            }),
            None => config_size("max_disk", c.max_disk.as_deref())?.map(|bytes| DiskBudget {
                bytes,
                scope: BudgetScope::OutputRoot,
            }),
        },
        upload: upload_plan(args, c.upload.as_ref())?,
    };
    Ok((s, triggers))
}

/// The upload settings: the command line's, else the file's `[upload]`.
/// The URL and the credentials are checked when the store opens.
fn upload_plan(
    args: &RunArgs,
    file: Option<&config::UploadConfig>,
) -> Result<Option<crate::upload::UploadPlan>, Failure> {
    let Some(url) = args.upload.clone().or(file.map(|f| f.url.clone())) else {
        return Ok(None);
    };
    // A bad URL, like missing credentials, does not stop the capture: the
    // run says so when it opens the store, and ends with exit code 5.
    let wait = match (args.upload_wait, file.and_then(|f| f.wait.as_deref())) {
        (Some(w), _) => w,
        (None, Some(w)) => {
            parse_duration(w).map_err(|e| Failure::usage(format!("bad [upload] wait: {e}")))?
        }
        (None, None) => crate::upload::DEFAULT_WAIT,
    };
    let host = match args
        .upload_host
        .clone()
        .or(file.and_then(|f| f.host.clone()))
    {
        Some(h) => h,
        None => crate::sys::proc::host_name(),
    };
    if !crate::upload::keys::plain_segment(&host) {
        return Err(Failure::usage(format!(
            "upload host name {host:?} must be a plain name (no '/', not starting with '.'); \
             set --upload-host"
        )));
    }
    Ok(Some(crate::upload::UploadPlan {
        url,
        host,
        delete: args.upload_delete || file.is_some_and(|f| f.delete),
        wait,
    }))
}

/// One trigger's options turned into values. Errors (exit code 2), for a
/// config file (clap has checked the command line's): `trigger NAME: bad
/// FIELD: why`.
fn trigger_plan(o: &TriggerOptions, name: String) -> Result<TriggerPlan, Failure> {
    let watch = match (&o.pid, &o.exe) {
        (Some(pid), _) => WatchArg::Pid(*pid),
        (None, Some(exe)) => WatchArg::Exe(exe.clone()),
        (None, None) => unreachable!("clap and config::parse require pid or exe"),
    };
    let bad = |field: &str, why: String| {
        Failure::usage(format!(
            "trigger {}: bad {field}: {why}",
            o.name.as_deref().unwrap_or("(unnamed)")
        ))
    };
    let duration = |field: &str, v: &Option<String>| {
        v.as_deref()
            .map(|v| parse_duration(v).map_err(|e| bad(field, e)))
            .transpose()
    };
    Ok(TriggerPlan {
        name,
        watch,
        query: Query {
            symbol: o.symbol.clone(),
            object: o.object.clone(),
            offset: o.offset,
            address: o.address,
        },
        wait_for_symbol: duration("wait_for_symbol", &o.wait_for_symbol)?,
        filters: Filters {
            tids: o.tids.clone(),
            when: o.when.clone(),
            slower_than: duration("slower_than", &o.slower_than)?,
            every: o.every,
            max_rate: o
                .max_rate
                .as_deref()
                .map(|v| parse_rate(v).map_err(|e| bad("max_rate", e)))
                .transpose()?,
            cooldown: duration("cooldown", &o.cooldown)?
                .map_or_else(|| parse_duration(DEFAULT_COOLDOWN), Ok)
                .expect("the default cooldown parses"),
        },
        use_uretprobe: o.use_uretprobe,
        probe_rets: o.probe_rets,
        always_armed: o.always_armed,
        follow_forks: o.pid.is_some() && !o.no_follow_forks,
        off_cpu: off_cpu(o, duration("off_cpu_window", &o.off_cpu_window)?),
        after: duration("after", &o.after)?,
        max_snapshots: o.max_snapshots,
    })
}

/// `--off-cpu-window` unless told otherwise: the report's `--window`.
pub const DEFAULT_OFF_CPU_WINDOW: Duration = Duration::from_secs(1);

/// Whether a trigger records the off-CPU breakdown, and its window.
fn off_cpu(o: &TriggerOptions, window: Option<Duration>) -> Option<Duration> {
    let on = !o.no_off_cpu && (o.off_cpu || o.slower_than.is_some());
    on.then(|| window.unwrap_or(DEFAULT_OFF_CPU_WINDOW))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn run_args(argv: &[&str]) -> RunArgs {
        crate::flags::defs::Cli::try_parse_from(argv).unwrap().run
    }

    fn config_file(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn command_line_run_options_override_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = config_file(
            &dir,
            "output = \"/from/file\"\nfreq = 49\nmax_targets = 3\nevent = \"task-clock\"\n\
             [[trigger]]\npid = 1\nsymbol = \"f\"\n",
        );
        let p = path.to_str().unwrap();
        let plan_of = |argv: &[&str]| plan(&run_args(argv)).unwrap();
        let s = plan_of(&["mt-agent", "--config", p]).settings;
        assert_eq!(s.output.as_deref(), Some(Path::new("/from/file")));
        assert_eq!((s.freq, s.max_targets), (49, 3));
        assert_eq!(s.event.as_deref(), Some("task-clock"));
        let s = plan_of(&["mt-agent", "--config", p, "-o", "/from/cli", "-F", "99"]).settings;
        assert_eq!(s.output.as_deref(), Some(Path::new("/from/cli")));
        assert_eq!((s.freq, s.max_targets), (99, 3));
    }

    #[test]
    fn a_command_line_trigger_gets_its_options_and_defaults() {
        let p = plan(&run_args(&[
            "mt-agent",
            "-p",
            "42",
            "-s",
            "f",
            "--when",
            "arg0 == 1",
            "--after",
            "5ms",
        ]))
        .unwrap();
        assert!(p.single_pid_run());
        assert_eq!(p.triggers.len(), 1);
        let t = &p.triggers[0];
        assert_eq!(
            (t.name.as_str(), &t.watch),
            ("trigger0", &WatchArg::Pid(42))
        );
        assert_eq!(t.query.symbol.as_deref(), Some("f"));
        assert_eq!(t.filters.when, ["arg0 == 1"]);
        assert_eq!(t.filters.cooldown, Duration::from_millis(100));
        assert_eq!(t.after, Some(Duration::from_millis(5)));
        assert_eq!((p.settings.freq, p.settings.max_targets), (999, 8));
        assert_eq!(p.ring_bytes, DEFAULT_RING_BYTES);
    }

    #[test]
    fn a_config_trigger_and_a_command_line_trigger_mean_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = config_file(
            &dir,
            "[[trigger]]\nname = \"api\"\nexe = \"/bin/true\"\nsymbol = \"f\"\ncooldown = \"1s\"\n\
             slower_than = \"2ms\"\nmax_rate = \"10/s\"\ntid = [7]\n",
        );
        let from_file = plan(&run_args(&["mt-agent", "--config", path.to_str().unwrap()])).unwrap();
        let from_cli = plan(&run_args(&[
            "mt-agent",
            "--exe",
            "/bin/true",
            "-s",
            "f",
            "--cooldown",
            "1s",
            "--slower-than",
            "2ms",
            "--max-rate",
            "10/s",
            "--tid",
            "7",
        ]))
        .unwrap();
        let (a, b) = (&from_file.triggers[0], &from_cli.triggers[0]);
        assert_eq!(a.name, "api");
        assert_eq!(a.watch, b.watch);
        assert_eq!(a.filters, b.filters);
        assert!(!from_file.single_pid_run() && !from_cli.single_pid_run());
        // Without cooldown, the file gets the command line's default.
        let path = config_file(&dir, "[[trigger]]\npid = 1\nsymbol = \"f\"\n");
        let p = plan(&run_args(&["mt-agent", "--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(p.triggers[0].filters.cooldown, Duration::from_millis(100));
        assert!(!p.triggers[0].always_armed);
        // --always-armed, from either source.
        let path = config_file(
            &dir,
            "[[trigger]]\npid = 1\nsymbol = \"f\"\nalways_armed = true\n",
        );
        let p = plan(&run_args(&["mt-agent", "--config", path.to_str().unwrap()])).unwrap();
        assert!(p.triggers[0].always_armed);
        let p = plan(&run_args(&[
            "mt-agent",
            "--pid",
            "1",
            "-s",
            "f",
            "--always-armed",
        ]))
        .unwrap();
        assert!(p.triggers[0].always_armed);
    }

    #[test]
    fn the_off_cpu_breakdown_is_on_for_slower_than_and_opt_in_otherwise() {
        let off = |args: &[&str]| {
            let mut v = vec!["mt-agent", "--pid", "1", "-s", "f"];
            v.extend_from_slice(args);
            plan(&run_args(&v)).unwrap().triggers[0].off_cpu
        };
        let s = Duration::from_secs;
        assert_eq!(off(&["--slower-than", "5ms"]), Some(s(1)));
        assert_eq!(off(&["--slower-than", "5ms", "--no-off-cpu"]), None);
        assert_eq!(off(&[]), None);
        assert_eq!(off(&["--off-cpu", "--off-cpu-window", "3s"]), Some(s(3)));
        let dir = tempfile::tempdir().unwrap();
        let path = config_file(
            &dir,
            "[[trigger]]\npid = 1\nsymbol = \"f\"\nslower_than = \"1ms\"\nno_off_cpu = true\n",
        );
        let p = plan(&run_args(&["mt-agent", "--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(p.triggers[0].off_cpu, None);
        assert!(
            crate::flags::defs::Cli::try_parse_from([
                "mt-agent",
                "--pid",
                "1",
                "-s",
                "f",
                "--off-cpu",
                "--no-off-cpu"
            ])
            .is_err()
        );
    }

    #[test]
    fn pid_triggers_follow_forks_unless_told_not_to() {
        let p = plan(&run_args(&["mt-agent", "--pid", "1", "-s", "f"])).unwrap();
        assert!(p.triggers[0].follow_forks);
        let p = plan(&run_args(&[
            "mt-agent",
            "--pid",
            "1",
            "-s",
            "f",
            "--no-follow-forks",
        ]))
        .unwrap();
        assert!(!p.triggers[0].follow_forks);
        // --exe follows forked processes its own way (its recorders).
        let p = plan(&run_args(&["mt-agent", "--exe", "/bin/true", "-s", "f"])).unwrap();
        assert!(!p.triggers[0].follow_forks);
        let dir = tempfile::tempdir().unwrap();
        let path = config_file(
            &dir,
            "[[trigger]]\npid = 1\nsymbol = \"f\"\nno_follow_forks = true\n",
        );
        let p = plan(&run_args(&["mt-agent", "--config", path.to_str().unwrap()])).unwrap();
        assert!(!p.triggers[0].follow_forks);
    }

    #[test]
    fn a_bad_duration_in_a_config_file_names_the_trigger_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = config_file(
            &dir,
            "[[trigger]]\nname = \"db\"\npid = 1\nsymbol = \"f\"\ncooldown = \"soon\"\n",
        );
        let err = plan(&run_args(&["mt-agent", "--config", path.to_str().unwrap()])).unwrap_err();
        assert!(
            err.message.starts_with("trigger db: bad cooldown: "),
            "{}",
            err.message
        );
    }

    #[test]
    fn bad_run_options_are_refused_before_any_system_access() {
        let err = |argv: &[&str]| plan(&run_args(argv)).unwrap_err().message;
        assert!(
            err(&["mt-agent", "-p", "1", "-s", "f", "--ring-bytes", "5000"])
                .contains("power of two")
        );
        assert!(err(&["mt-agent", "-p", "1", "-s", "f", "--", "-a"]).contains("not allowed"));
        assert!(err(&["mt-agent", "-p", "1", "-s", "f", "--when", "arg9 == 1"]).contains("--when"));
    }

    #[test]
    fn output_directories_by_kind_of_run() {
        let stamp = "20261201-040000";
        let pid = plan(&run_args(&["mt-agent", "-p", "42", "-s", "f"])).unwrap();
        assert_eq!(
            pid.output_dir(stamp),
            Path::new("mt-agent-42-20261201-040000")
        );
        assert_eq!(
            pid.trigger_dir(Path::new("/o"), &pid.triggers[0]),
            Path::new("/o")
        );
        let exe = plan(&run_args(&[
            "mt-agent",
            "--exe",
            "/usr/bin/api",
            "-s",
            "f",
            "-o",
            "/x",
        ]))
        .unwrap();
        assert_eq!(exe.output_dir(stamp), Path::new("/x"));
        let dir = tempfile::tempdir().unwrap();
        let path = config_file(
            &dir,
            "output = \"/var/lib/m\"\n[[trigger]]\nname = \"db\"\npid = 1\nsymbol = \"f\"\n",
        );
        let cfg = plan(&run_args(&["mt-agent", "--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(
            cfg.output_dir(stamp),
            Path::new("/var/lib/m/20261201-040000")
        );
        assert_eq!(
            cfg.trigger_dir(Path::new("/o"), &cfg.triggers[0]),
            Path::new("/o/db")
        );
    }
}
