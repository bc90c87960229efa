//! Builds `src/shim.c` (the malloc family, the initial-exec thread flags and the mmap
//! interposition) against the mimalloc headers that `libmimalloc-sys` exports.

fn main() {
    let include = std::env::var("DEP_MIMALLOC_INCLUDE_DIR")
        .expect("libmimalloc-sys must export its include dir (DEP_MIMALLOC_INCLUDE_DIR)");
    println!("cargo:rerun-if-changed=src/shim.c");
    cc::Build::new()
        .file("src/shim.c")
        .include(include)
        .flag("-ftls-model=initial-exec")
        .flag("-fno-builtin-malloc")
        .flag("-fvisibility=hidden")
        .flag_if_supported("-Wall")
        .flag_if_supported("-Wextra")
        .define("_GNU_SOURCE", None)
        .opt_level(2)
        .compile("farmem_shim");
}
