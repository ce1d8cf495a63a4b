fn main() { println!("{}", include_bytes!(concat!(env!("OUT_DIR"), "/mt-agent-ebpf")).len()); }
