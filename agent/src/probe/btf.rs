//! The byte offset of a struct member in the running kernel, from its BTF
//! (`/sys/kernel/btf/vmlinux`, readable by anyone). `mt_fork` reads the
//! child's `task_struct.tgid` at that offset, which changes with the
//! kernel's build. Format: the kernel's Documentation/bpf/btf.rst
//! (`struct btf_header`, `struct btf_type` and each kind's trailing data).

use std::path::Path;

/// `BTF_KIND_STRUCT`.
const KIND_STRUCT: u32 = 4;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn str_at(strings: &[u8], off: u32) -> Option<&[u8]> {
    let s = strings.get(off as usize..)?;
    Some(&s[..s.iter().position(|&c| c == 0)?])
}

/// Bytes of data that follow a `btf_type` of `kind` with `vlen` entries.
fn trailing(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, cv, func, float, type tag
        1 | 14 | 17 => 4,          // int, var, decl tag
        3 => 12,                   // array
        4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
        6 | 13 => 8 * vlen,        // enum, func proto
        _ => return None,
    })
}

/// The byte offset of `member` in `struct name`, from raw BTF (little
/// endian). None when absent, a bitfield, or the data is not BTF.
pub fn member_offset(btf: &[u8], name: &str, member: &str) -> Option<u32> {
    if btf.get(0..2)? != [0x9f, 0xeb] {
        return None;
    }
    let hdr_len = u32_at(btf, 4)? as usize;
    let (type_off, type_len) = (u32_at(btf, 8)? as usize, u32_at(btf, 12)? as usize);
    let (str_off, str_len) = (u32_at(btf, 16)? as usize, u32_at(btf, 20)? as usize);
    let types = btf.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
    let strings = btf.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    let mut at = 0;
    while at + 12 <= types.len() {
        let (name_off, info) = (u32_at(types, at)?, u32_at(types, at + 4)?);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        let body = at + 12;
        if kind == KIND_STRUCT && str_at(strings, name_off)? == name.as_bytes() {
            for i in 0..vlen {
                let m = body + 12 * i;
                if str_at(strings, u32_at(types, m)?)? == member.as_bytes() {
                    // With kind_flag, the low 24 bits are the bit offset.
                    let bits = u32_at(types, m + 8)?;
                    let bits = if info >> 31 == 1 {
                        bits & 0xff_ffff
                    } else {
                        bits
                    };
                    return (bits % 8 == 0).then_some(bits / 8);
                }
            }
        }
        at = body + trailing(kind, vlen)?;
    }
    None
}

/// `task_struct.tgid`'s offset in the running kernel, or a one-line reason.
pub fn task_tgid_offset(vmlinux: &Path) -> Result<u32, String> {
    let btf = std::fs::read(vmlinux).map_err(|e| format!("reading {}: {e}", vmlinux.display()))?;
    member_offset(&btf, "task_struct", "tgid")
        .ok_or_else(|| format!("no task_struct.tgid in {}", vmlinux.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_task_struct_tgid_in_the_running_kernel() {
        let off = task_tgid_offset(Path::new("/sys/kernel/btf/vmlinux")).unwrap();
        // tgid follows pid, both pid_t, deep inside task_struct.
        let pid = member_offset(
            &std::fs::read("/sys/kernel/btf/vmlinux").unwrap(),
            "task_struct",
            "pid",
        )
        .unwrap();
        assert_eq!(off, pid + 4);
        assert!(off > 100);
    }

    #[test]
    fn not_btf_or_truncated_is_none() {
        assert_eq!(member_offset(b"", "task_struct", "tgid"), None);
        assert_eq!(member_offset(&[0x9f, 0xeb, 1, 0, 24], "a", "b"), None);
    }
}
