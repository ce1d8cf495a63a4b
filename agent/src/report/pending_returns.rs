//! Return addresses a uretprobe hid from a snapshot's DWARF stack copies,
//! put back (docs/uprobe-cost.md, "Stacks in the report").
//!
//! While a call under a uretprobe runs, the slot on the stack that holds
//! its return address holds the kernel's trampoline address instead
//! (`arch_uretprobe_hijack_return_addr`, arch/x86/kernel/uprobes.c). The
//! kernel repairs the frame-pointer call chains it writes
//! (`fixup_uretprobe_trampoline_entries`, kernel/events/callchain.c), but a
//! DWARF sample (`PERF_SAMPLE_STACK_USER`) carries a raw copy of the stack,
//! and perf's unwinder stops at the trampoline, which has no unwind info.
//! That copy is what the off-CPU breakdown's `sched_switch` samples take.
//!
//! The entry probe reads the return address before the kernel replaces it
//! (every consumer's handler runs first, then the return is hijacked:
//! `handler_chain`, kernel/events/uprobes.c), and a `--slower-than` hit
//! carries it with the slot's address ([`PendingReturn`]). For each sample
//! of the hit's thread taken during the call whose copy covers the slot,
//! the report writes the return address back into a copy of the snapshot,
//! and `perf script` reads that copy. Samples of calls that were not slow
//! enough to be hits are not repaired here; the graft (report/graft.rs)
//! completes those it can from the repaired stacks of their thread.
//!
//! The pure part, unit-tested: [`slot_in_copy`].

use std::{
    collections::HashMap,
    fs::File,
    io::{self, BufReader, Read, Seek, SeekFrom},
    os::unix::fs::FileExt as _,
};

use linux_perf_data::{
    AttributeDescription, PerfFileReader,
    linux_perf_event_reader::{
        EventRecord, RawData, RawEventRecord, RecordParseInfo, RecordType, SampleFormat,
        constants::PERF_REG_X86_SP,
    },
};

use crate::{
    output::index::{IndexedHit, PendingReturn},
    report::jitdump::{data_section, reopen},
};

/// One `--slower-than` call that a hit reported: its thread, when it ran
/// (CLOCK_MONOTONIC ns, the clock of perf's `-k CLOCK_MONOTONIC`), and its
/// return address's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    pub tid: u32,
    pub from_ns: u64,
    pub to_ns: u64,
    pub ret: PendingReturn,
}

/// The calls of a snapshot's hits that carry their return address.
pub fn calls_of<'a>(hits: impl IntoIterator<Item = &'a IndexedHit>) -> Vec<Call> {
    hits.into_iter()
        .filter_map(|h| {
            let ret = h.pending_return?;
            let to_ns = h.ktime_ns;
            Some(Call {
                tid: h.tid,
                from_ns: to_ns.saturating_sub(h.duration_ns?),
                to_ns,
                ret,
            })
        })
        .collect()
}

/// Where, in a stack copy of `len` bytes taken at stack pointer `sp` by
/// thread `tid` at `time_ns`, `call`'s return address belongs: the byte
/// offset of its slot, if the sample was taken during the call and the
/// copy holds the slot whole. Outside the call the slot is above the
/// stack pointer's reach or belongs to another call at the same depth.
pub fn slot_in_copy(call: &Call, tid: u32, time_ns: u64, sp: u64, len: u64) -> Option<u64> {
    let during = (call.from_ns..=call.to_ns).contains(&time_ns);
    let at = call.ret.entry_sp.checked_sub(sp)?;
    (tid == call.tid && during && at.checked_add(8)? <= len).then_some(at)
}

/// A copy of `snapshot` with `calls`' return addresses written back into
/// the stack copies of its samples, and how many were written (slots that
/// held another value); `None` when no sample needed one. The copy is an
/// unlinked temporary file. Errors (one line): the file could not be read
/// as perf.data, or the copy could not be written.
pub fn repair(snapshot: &File, calls: &[Call]) -> Result<Option<(File, usize)>, String> {
    if calls.is_empty() {
        return Ok(None);
    }
    let patches = patches(snapshot, calls).map_err(|e| format!("reading stack copies: {e}"))?;
    if patches.is_empty() {
        return Ok(None);
    }
    let write = |e: io::Error| format!("writing a copy with the return addresses: {e}");
    let mut copy = tempfile::tempfile().map_err(write)?;
    let mut src = reopen(snapshot).map_err(write)?;
    io::copy(&mut src, &mut copy).map_err(write)?;
    for (at, value) in &patches {
        copy.write_all_at(&value.to_le_bytes(), *at)
            .map_err(write)?;
    }
    Ok(Some((copy, patches.len())))
}

/// (file offset, return address) of every slot to write.
fn patches(snapshot: &File, calls: &[Call]) -> io::Result<Vec<(u64, u64)>> {
    let reader = PerfFileReader::parse_file(BufReader::new(reopen(snapshot)?))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let perf = reader.perf_file;
    let attrs = perf.event_attributes();
    let infos: Vec<RecordParseInfo> = attrs
        .iter()
        .map(|a| RecordParseInfo::new(&a.attr, perf.endian()))
        .collect();
    if !infos
        .iter()
        .any(|i| i.sample_format.contains(SampleFormat::STACK_USER))
    {
        // No stack copies (frame-pointer stacks, no off-CPU breakdown).
        return Ok(Vec::new());
    }
    let by_id = ids_of(attrs);
    let mut src = reopen(snapshot)?;
    let (data_at, data_size) = data_section(&mut src)?;
    src.seek(SeekFrom::Start(data_at))?;
    let mut src = BufReader::with_capacity(1 << 20, src.take(data_size));
    let (mut pos, mut out, mut body) = (data_at, Vec::new(), Vec::new());
    let mut head = [0u8; 8];
    while read_full(&mut src, &mut head)? {
        let kind = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let misc = u16::from_le_bytes([head[4], head[5]]);
        let size = u16::from_le_bytes([head[6], head[7]]) as usize;
        if size < 8 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a record of size < 8",
            ));
        }
        body.resize(size - 8, 0);
        src.read_exact(&mut body)?;
        if kind == RecordType::SAMPLE.0 && !infos.is_empty() {
            let body_at = pos + 8;
            if let Some((off, value)) = sample_patch(&body, misc, &infos, &by_id, calls) {
                out.push((body_at + off, value));
            }
        }
        pos += size as u64;
    }
    Ok(out)
}

/// Event id → index of its attribute.
fn ids_of(attrs: &[AttributeDescription]) -> HashMap<u64, usize> {
    attrs
        .iter()
        .enumerate()
        .flat_map(|(i, a)| a.event_ids.iter().map(move |&id| (id, i)))
        .collect()
}

/// The patch one sample needs, as (offset in its body, return address):
/// parsed with the first attribute, then again with its own if its id
/// names another (perf gives every sample the id first,
/// `PERF_SAMPLE_IDENTIFIER`, when a file has several events).
fn sample_patch(
    body: &[u8],
    misc: u16,
    infos: &[RecordParseInfo],
    by_id: &HashMap<u64, usize>,
    calls: &[Call],
) -> Option<(u64, u64)> {
    let parse = |info: &RecordParseInfo| {
        let raw = RawEventRecord::new(RecordType::SAMPLE, misc, RawData::Single(body), *info);
        match raw.parse() {
            Ok(EventRecord::Sample(s)) => Some(s),
            _ => None,
        }
    };
    let mut s = parse(&infos[0])?;
    if let Some(&i) = s.id.and_then(|id| by_id.get(&id))
        && i != 0
    {
        s = parse(&infos[i])?;
    }
    let (stack, dyn_size) = s.user_stack?;
    let RawData::Single(bytes) = stack else {
        return None;
    };
    let sp = s.user_regs.as_ref()?.get(PERF_REG_X86_SP)?;
    let (tid, time) = (s.tid? as u32, s.timestamp?);
    let len = dyn_size.min(bytes.len() as u64);
    let copy_at = bytes.as_ptr() as u64 - body.as_ptr() as u64;
    calls.iter().find_map(|c| {
        let at = slot_in_copy(c, tid, time, sp, len)?;
        let old = u64::from_le_bytes(bytes[at as usize..at as usize + 8].try_into().ok()?);
        (old != c.ret.return_address).then_some((copy_at + at, c.ret.return_address))
    })
}

/// Fills `buf`; `false` at a clean end of input.
fn read_full(src: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match src.read(&mut buf[got..])? {
            0 if got == 0 => return Ok(false),
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call() -> Call {
        Call {
            tid: 7,
            from_ns: 1_000,
            to_ns: 2_000,
            ret: PendingReturn {
                entry_sp: 0x7fff_0000_1000,
                return_address: 0x5555_0000_0042,
            },
        }
    }

    #[test]
    fn the_slot_is_found_in_a_copy_taken_during_the_call_that_holds_it() {
        let c = call();
        let sp = 0x7fff_0000_0c00;
        assert_eq!(slot_in_copy(&c, 7, 1_500, sp, 4096), Some(0x400));
        // The call's edges count: the entry and the return probe's times.
        assert_eq!(slot_in_copy(&c, 7, 1_000, sp, 4096), Some(0x400));
        assert_eq!(slot_in_copy(&c, 7, 2_000, sp, 4096), Some(0x400));
        // The slot's last byte is the copy's last.
        assert_eq!(slot_in_copy(&c, 7, 1_500, sp, 0x408), Some(0x400));
    }

    #[test]
    fn other_threads_other_times_and_copies_short_of_the_slot_are_left_alone() {
        let c = call();
        let sp = 0x7fff_0000_0c00;
        assert_eq!(slot_in_copy(&c, 8, 1_500, sp, 4096), None);
        assert_eq!(slot_in_copy(&c, 7, 999, sp, 4096), None);
        assert_eq!(slot_in_copy(&c, 7, 2_001, sp, 4096), None);
        assert_eq!(slot_in_copy(&c, 7, 1_500, sp, 0x407), None);
        // Taken above the slot: the call had returned (or not begun).
        assert_eq!(slot_in_copy(&c, 7, 1_500, 0x7fff_0000_1008, 4096), None);
    }

    #[test]
    fn only_hits_with_a_pending_return_and_a_duration_give_calls() {
        let hit = |tid, pending: bool| IndexedHit {
            tid,
            ktime_ns: 5_000,
            duration_ns: Some(3_000),
            pending_return: pending.then_some(call().ret),
            ..Default::default()
        };
        let calls = calls_of(&[hit(1, false), hit(2, true)]);
        assert_eq!(
            calls,
            vec![Call {
                tid: 2,
                from_ns: 2_000,
                to_ns: 5_000,
                ret: call().ret,
            }]
        );
    }
}
