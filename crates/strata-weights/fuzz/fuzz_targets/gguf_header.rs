//! GGUF parsing and tensor decoding on arbitrary bytes must never panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| strata_weights::fuzzing::gguf(data));
