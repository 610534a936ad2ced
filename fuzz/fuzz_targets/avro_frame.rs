#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| parsley_fuzz::run("avro_frame", data));
