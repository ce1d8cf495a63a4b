//! Trigger conditions: parsing `--when` expressions and building the
//! [`TriggerConfig`] table the eBPF program evaluates. No code generation:
//! the kernel side walks a fixed-size table.
//!
//! `--when` grammar: `ARG OP CONST`, where ARG is `arg0`..`arg5` (unsigned)
//! or `sarg0`..`sarg5` (signed), OP one of `== != < <= > >= &`, and CONST a
//! decimal or `0x` hex integer (negative only with a signed argument).
//! `arg1 & 0x4` holds when `(arg1 & 0x4) != 0`.

use std::time::Duration;

use agent_common::{
    CFG_AT_RETURN, CFG_ENABLED, CFG_GO_ABI, Cond, CondOp, MAX_CONDS, MAX_TIDS, TriggerConfig,
};

use crate::error::Failure;

/// A `--when` expression that did not parse: what is wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhenError {
    /// Byte position of the problem in the expression.
    pub pos: usize,
    pub message: String,
}

impl WhenError {
    /// The failure to print: the message, then the expression with a caret.
    pub fn into_failure(self, expr: &str) -> Failure {
        Failure::usage(format!("bad --when expression: {}", self.message)).with_detail([
            format!("--when '{expr}'"),
            format!("{}^", " ".repeat("--when '".len() + self.pos)),
        ])
    }
}

/// Parses one `--when` expression.
pub fn parse_when(expr: &str) -> Result<Cond, WhenError> {
    let mut i = skip_ws(expr, 0);
    let (arg, signed) = parse_argument(expr, &mut i)?;
    i = skip_ws(expr, i);
    let op = parse_operator(expr, &mut i)?;
    i = skip_ws(expr, i);
    // Constant.
    let c_start = i;
    let b = expr.as_bytes();
    while i < b.len() && !b[i].is_ascii_whitespace() {
        i += 1;
    }
    let value = parse_constant(&expr[c_start..i], signed).map_err(|message| WhenError {
        pos: c_start,
        message,
    })?;
    i = skip_ws(expr, i);
    if i < b.len() {
        return Err(WhenError {
            pos: i,
            message: format!(
                "unexpected `{}` after the constant; one comparison per --when (repeat it for AND)",
                &expr[i..]
            ),
        });
    }
    Ok(Cond {
        arg,
        op: op as u8,
        signed: u8::from(signed),
        _pad: [0; 5],
        value,
    })
}

/// The position of the first non-blank byte of `expr` at or after `i`.
fn skip_ws(expr: &str, mut i: usize) -> usize {
    let b = expr.as_bytes();
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// `arg0`..`arg5` or `sarg0`..`sarg5` at `*i`: the index and whether it
/// is signed. Moves `*i` past it.
fn parse_argument(expr: &str, i: &mut usize) -> Result<(u8, bool), WhenError> {
    let b = expr.as_bytes();
    let arg_start = *i;
    while *i < b.len() && (b[*i].is_ascii_alphanumeric() || b[*i] == b'_') {
        *i += 1;
    }
    let word = &expr[arg_start..*i];
    let unknown = || WhenError {
        pos: arg_start,
        message: format!("unknown argument `{word}`; use arg0..arg5, or sarg0..sarg5 for signed"),
    };
    let (signed, num) = if let Some(n) = word.strip_prefix("sarg") {
        (true, n)
    } else if let Some(n) = word.strip_prefix("arg") {
        (false, n)
    } else if word.is_empty() {
        return Err(WhenError {
            pos: arg_start,
            message: "expected an argument such as arg0 or sarg1".into(),
        });
    } else {
        return Err(unknown());
    };
    match num.parse() {
        Ok(n) if n < 6 => Ok((n, signed)),
        _ => Err(unknown()),
    }
}

/// The comparison operator at `*i`. Moves `*i` past it.
fn parse_operator(expr: &str, i: &mut usize) -> Result<CondOp, WhenError> {
    let op_start = *i;
    let rest = &expr[*i..];
    let (op, len) = [
        ("==", CondOp::Eq),
        ("!=", CondOp::Ne),
        ("<=", CondOp::Le),
        (">=", CondOp::Ge),
        ("<", CondOp::Lt),
        (">", CondOp::Gt),
        ("&", CondOp::Mask),
    ]
    .iter()
    .find(|(s, _)| rest.starts_with(s))
    .map(|(s, op)| (*op, s.len()))
    .ok_or_else(|| WhenError {
        pos: op_start,
        message: format!(
            "expected an operator (== != < <= > >= &), found `{}`",
            rest.split_whitespace()
                .next()
                .unwrap_or("end of expression")
        ),
    })?;
    *i += len;
    if rest.starts_with("&&")
        || rest.starts_with("===")
        || rest.starts_with("=>")
        || rest.starts_with("=<")
    {
        return Err(WhenError {
            pos: op_start,
            message: "bad operator; use one of == != < <= > >= & (repeat --when for AND)".into(),
        });
    }
    Ok(op)
}

fn parse_constant(text: &str, signed: bool) -> Result<u64, String> {
    if text.is_empty() {
        return Err("expected a constant (decimal or 0x hex)".into());
    }
    let (neg, digits) = match text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, text),
    };
    let (radix, digits) = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(h) => (16, h),
        None => (10, digits),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(format!("`{text}` is not a number (decimal or 0x hex)"));
    }
    let magnitude = u64::from_str_radix(digits, radix)
        .map_err(|_| format!("constant `{text}` does not fit in 64 bits"))?;
    if neg {
        if !signed {
            return Err(format!(
                "negative constant `{text}` with an unsigned argument; use sargN"
            ));
        }
        if magnitude > 1u64 << 63 {
            return Err(format!(
                "constant `{text}` does not fit in a signed 64-bit integer"
            ));
        }
        return Ok(magnitude.wrapping_neg());
    }
    if signed && radix == 10 && magnitude > i64::MAX as u64 {
        return Err(format!(
            "constant `{text}` does not fit in a signed 64-bit integer"
        ));
    }
    Ok(magnitude)
}

/// The filters of one trigger, as given on the command line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filters {
    pub tids: Vec<u32>,
    pub when: Vec<String>,
    pub slower_than: Option<Duration>,
    pub every: Option<u64>,
    pub max_rate: Option<f64>,
    pub cooldown: Duration,
}

/// The least time between two calls that `--max-rate` lets through, ns.
pub fn rate_interval_ns(per_s: f64) -> u64 {
    (1e9 / per_s).round().max(1.0) as u64
}

/// How long no call can be accepted after an accepted hit: the cooldown,
/// or the `--max-rate` interval if longer (the hit took the rate's token
/// too). None with no cooldown: `--cooldown 0` never disarms.
pub fn closed_after_hit(f: &Filters) -> Option<Duration> {
    if f.cooldown.is_zero() {
        return None;
    }
    let rate = f.max_rate.map_or(Duration::ZERO, |r| {
        Duration::from_nanos(rate_interval_ns(r))
    });
    Some(f.cooldown.max(rate))
}

/// How long a `--pid` trigger's uprobes go out of the code after an
/// accepted hit: [`closed_after_hit`], but never with `--slower-than`. A
/// call must be seen entering to be timed, and a call that enters during
/// the cooldown can return after it: so those probes stay in, the kernel's
/// cooldown still lets one hit through per cooldown, and a slow call that
/// returns inside it is counted in `dropped.cooldown`
/// (docs/disarming.md, "`--slower-than` keeps its probes in").
pub fn disarmed_after_hit(f: &Filters) -> Option<Duration> {
    if f.slower_than.is_some() {
        return None;
    }
    closed_after_hit(f)
}

/// Builds the kernel's table for one trigger. `go_abi` selects Go's
/// register ABI for arguments.
///
/// Errors (exit code 2): a bad `--when`, too many `--when` or `--tid`.
pub fn trigger_config(f: &Filters, go_abi: bool) -> Result<TriggerConfig, Failure> {
    let mut cfg = TriggerConfig {
        flags: CFG_ENABLED,
        ..TriggerConfig::default()
    };
    if go_abi {
        cfg.flags |= CFG_GO_ABI;
    }
    if f.tids.len() > MAX_TIDS {
        return Err(Failure::usage(format!("at most {MAX_TIDS} --tid values")));
    }
    for (i, t) in f.tids.iter().enumerate() {
        cfg.tids[i] = *t;
    }
    cfg.n_tids = f.tids.len() as u32;
    if f.when.len() > MAX_CONDS {
        return Err(Failure::usage(format!(
            "at most {MAX_CONDS} --when expressions"
        )));
    }
    for (i, e) in f.when.iter().enumerate() {
        cfg.conds[i] = parse_when(e).map_err(|err| err.into_failure(e))?;
    }
    cfg.n_conds = f.when.len() as u32;
    if let Some(d) = f.slower_than {
        cfg.flags |= CFG_AT_RETURN;
        cfg.slower_than_ns = d.as_nanos() as u64;
    }
    cfg.every = f.every.unwrap_or(0);
    if let Some(r) = f.max_rate {
        cfg.rate_interval_ns = rate_interval_ns(r);
    }
    cfg.cooldown_ns = f.cooldown.as_nanos() as u64;
    cfg.tick_ns = kernel_tick_ns();
    Ok(cfg)
}

/// The kernel tick, ns: the resolution of CLOCK_MONOTONIC_COARSE (one
/// jiffy). 0 when it cannot be trusted for the gates' jiffies fast path:
/// with `nohz_full` CPUs, jiffies can lag by more than a tick.
pub fn kernel_tick_ns() -> u64 {
    let nohz_full =
        std::fs::read_to_string("/sys/devices/system/cpu/nohz_full").unwrap_or_default();
    let nohz_full = nohz_full.trim();
    if !nohz_full.is_empty() && nohz_full != "(null)" {
        return 0;
    }
    nix::time::clock_getres(nix::time::ClockId::CLOCK_MONOTONIC_COARSE)
        .map(|ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
        .ok()
        .filter(|&ns| (1_000_000..=10_000_000).contains(&ns))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(e: &str) -> Cond {
        parse_when(e).unwrap_or_else(|err| panic!("{e}: {err:?}"))
    }

    #[test]
    fn expressions_parse() {
        let c = ok("arg0 == 42");
        assert_eq!(
            (c.arg, c.op, c.signed, c.value),
            (0, CondOp::Eq as u8, 0, 42)
        );
        let c = ok("arg1&0x4");
        assert_eq!((c.arg, c.op, c.value), (1, CondOp::Mask as u8, 4));
        let c = ok("  sarg2 < -5 ");
        assert_eq!(
            (c.arg, c.op, c.signed, c.value as i64),
            (2, CondOp::Lt as u8, 1, -5)
        );
        assert_eq!(ok("arg5 >= 0xffffffffffffffff").value, u64::MAX);
        assert_eq!(ok("arg3 != 7").op, CondOp::Ne as u8);
        assert_eq!(ok("arg3 <= 7").op, CondOp::Le as u8);
        assert_eq!(ok("arg3 > 7").op, CondOp::Gt as u8);
    }

    #[test]
    fn errors_point_at_the_problem() {
        let e = parse_when("arg7 == 1").unwrap_err();
        assert_eq!(e.pos, 0);
        assert!(e.message.contains("unknown argument `arg7`"));
        let e = parse_when("arg0 =~ 1").unwrap_err();
        assert_eq!(e.pos, 5);
        assert!(e.message.contains("operator"));
        let e = parse_when("arg0 == 99999999999999999999").unwrap_err();
        assert_eq!(e.pos, 8);
        assert!(e.message.contains("does not fit"));
        let e = parse_when("arg0 == -1").unwrap_err();
        assert!(e.message.contains("use sargN"));
        let e = parse_when("arg0 == 1 && arg1 == 2").unwrap_err();
        assert_eq!(e.pos, 10);
        let e = parse_when("arg0 && 1").unwrap_err();
        assert_eq!(e.pos, 5);
        let f = parse_when("foo == 1").unwrap_err().into_failure("foo == 1");
        assert_eq!(f.detail[1], "        ^");
    }

    #[test]
    fn conditions_evaluate_like_the_kernel() {
        let args = [42, 5, (-3i64) as u64, 0, 0, 0];
        assert!(ok("arg0 == 42").holds(&args));
        assert!(!ok("arg0 != 42").holds(&args));
        assert!(ok("arg1 & 0x4").holds(&args));
        assert!(!ok("arg1 & 0x2").holds(&args));
        assert!(ok("sarg2 < 0").holds(&args));
        assert!(!ok("arg2 < 0x10").holds(&args)); // unsigned: huge
        assert!(ok("arg1 >= 5").holds(&args));
        assert!(ok("arg1 <= 5").holds(&args));
        assert!(!ok("arg1 > 5").holds(&args));
    }

    #[test]
    fn config_table() {
        let f = Filters {
            tids: vec![7, 8],
            when: vec!["arg0 == 1".into()],
            slower_than: Some(Duration::from_millis(5)),
            every: Some(100),
            max_rate: Some(10.0),
            cooldown: Duration::from_millis(100),
        };
        let c = trigger_config(&f, true).unwrap();
        assert_eq!(c.flags, CFG_ENABLED | CFG_GO_ABI | CFG_AT_RETURN);
        assert_eq!((c.n_tids, c.tids[1]), (2, 8));
        assert_eq!(c.n_conds, 1);
        assert_eq!(c.slower_than_ns, 5_000_000);
        assert_eq!(c.every, 100);
        assert_eq!(c.rate_interval_ns, 100_000_000);
        assert_eq!(c.cooldown_ns, 100_000_000);
        let too_many = Filters {
            when: vec!["arg0 == 1".into(); 9],
            ..Filters::default()
        };
        assert!(trigger_config(&too_many, false).is_err());
    }

    #[test]
    fn no_call_is_accepted_for_the_longer_of_the_cooldown_and_the_rate_interval() {
        let ms = Duration::from_millis;
        let f = |cooldown, max_rate| Filters {
            cooldown,
            max_rate,
            ..Filters::default()
        };
        assert_eq!(closed_after_hit(&f(ms(100), None)), Some(ms(100)));
        assert_eq!(closed_after_hit(&f(ms(100), Some(2.0))), Some(ms(500)));
        assert_eq!(closed_after_hit(&f(ms(100), Some(50.0))), Some(ms(100)));
        assert_eq!(closed_after_hit(&f(ms(0), Some(2.0))), None);
    }

    #[test]
    fn a_slower_than_trigger_is_never_disarmed() {
        let ms = Duration::from_millis;
        let plain = Filters {
            cooldown: ms(100),
            ..Filters::default()
        };
        assert_eq!(disarmed_after_hit(&plain), Some(ms(100)));
        let slow = Filters {
            slower_than: Some(ms(100)),
            max_rate: Some(2.0),
            ..plain
        };
        assert_eq!(disarmed_after_hit(&slow), None);
        // The kernel's cooldown still holds it to one hit per cooldown.
        assert_eq!(closed_after_hit(&slow), Some(ms(500)));
    }
}
