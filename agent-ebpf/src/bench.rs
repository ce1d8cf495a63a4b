//! The benchmark's floor, `mt_floor`: a uprobe program that returns at once,
//! to measure what any uprobe costs here. Used only by `cargo xtask bench`,
//! which loads this object; the agent's own object (`src/main.rs`) does not
//! hold it.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

#[cfg(target_arch = "bpf")]
mod prog {
    use aya_ebpf::{macros::uprobe, programs::ProbeContext};

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        // SAFETY: the program has no panic path.
        unsafe { core::hint::unreachable_unchecked() }
    }

    #[uprobe]
    pub fn mt_floor(_ctx: ProbeContext) -> u32 {
        0
    }
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
