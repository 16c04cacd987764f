//! The `code-interpreter` recipe: `base` plus real Jupyter kernels for e2b's Code Interpreter
//! (IPython with the data stack people expect, R with IRkernel, bash, Java with jjava, and
//! this project's JavaScript/TypeScript kernel on Node.js), the kernel-side files that shape their results,
//! and the configuration the sandbox's interpreter server reads. Everything the kernels run is
//! in the files beside this module; this module only says where each goes.

use super::derive::File;
use super::recipes::Recipe;
use crate::sandbox::services::Service;

const fn file(path: &'static str, content: &'static str) -> File {
    File {
        path,
        content: content.as_bytes(),
        mode: 0o644,
    }
}

const FILES: &[File] = &[
    file(
        crate::interpreter::TEMPLATE_CONFIG,
        include_str!("code-interpreter.json"),
    ),
    file(
        "/etc/ipython/ipython_kernel_config.py",
        include_str!("ipython_kernel_config.py"),
    ),
    file("/etc/matplotlibrc", include_str!("matplotlibrc")),
    file(
        "/usr/local/lib/python3.11/dist-packages/sandbox_gateway_kernel.py",
        include_str!("python/sandbox_gateway_kernel.py"),
    ),
    file(
        "/usr/local/lib/python3.11/dist-packages/sandbox_gateway_display.py",
        include_str!("python/sandbox_gateway_display.py"),
    ),
    file(
        "/usr/local/lib/python3.11/dist-packages/sandbox_gateway_bash.py",
        include_str!("python/sandbox_gateway_bash.py"),
    ),
    file(
        "/usr/local/share/jupyter/kernels/python3/kernel.json",
        include_str!("kernels/python3.json"),
    ),
    file(
        "/usr/local/share/jupyter/kernels/javascript/kernel.json",
        include_str!("kernels/javascript.json"),
    ),
    file(
        "/usr/local/share/jupyter/kernels/typescript/kernel.json",
        include_str!("kernels/typescript.json"),
    ),
    file(
        "/usr/local/share/jupyter/kernels/ir/kernel.json",
        include_str!("kernels/ir.json"),
    ),
    file(
        "/usr/local/share/jupyter/kernels/bash/kernel.json",
        include_str!("kernels/bash.json"),
    ),
    file(
        "/usr/local/share/jupyter/kernels/java/kernel.json",
        include_str!("kernels/java.json"),
    ),
    file(
        "/opt/sandbox-gateway/js-kernel/kernel.js",
        include_str!("js-kernel/kernel.js"),
    ),
    file(
        "/opt/sandbox-gateway/js-kernel/package.json",
        include_str!("js-kernel/package.json"),
    ),
    file(
        "/opt/sandbox-gateway/js-kernel/package-lock.json",
        include_str!("js-kernel/package-lock.json"),
    ),
];

/// Runs last, in the new tree: the JavaScript kernel's packages (from its lock file, no
/// install scripts: zeromq's native module ships prebuilt in its package), the font cache
/// matplotlib would otherwise build in every new kernel, and the `python` command.
const COMMANDS: &[&str] = &[
    "cd /opt/sandbox-gateway/js-kernel && npm ci --ignore-scripts --no-audit --no-fund --loglevel=warn",
    "MATPLOTLIBRC=/etc/matplotlibrc python3 -c 'import matplotlib.pyplot'",
    "python3 -c 'import sandbox_gateway_display, sandbox_gateway_bash'",
];

pub const RECIPE: Recipe = Recipe {
    name: "code-interpreter",
    aliases: &["code-interpreter-v1"],
    from: "base",
    apt: &[
        "python-is-python3",
        "r-base-core",
        "r-cran-irkernel",
        "openjdk-17-jdk-headless",
        "fonts-wqy-microhei",
    ],
    pip: Some(include_str!("requirements.txt")),
    files: FILES,
    commands: COMMANDS,
    services: &[Service::CodeInterpreter],
    // Its kernels (Python with its imports warm, Node.js, and R or Java when used) need more
    // than the smallest tier's 512 MiB.
    size: Some("medium"),
    note: "the code-interpreter template (Python with its data stack, R, JavaScript/TypeScript, bash and Java kernels) downloads about 350 MB and takes a few minutes to build",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernelspec_parses_and_every_configured_kernel_is_shipped() {
        let config: crate::interpreter::Config =
            serde_json::from_str(include_str!("code-interpreter.json")).unwrap();
        for (language, kernel) in &config.kernels {
            let path = format!("/usr/local/share/jupyter/kernels/{kernel}/kernel.json");
            let f = FILES
                .iter()
                .find(|f| f.path == path)
                .unwrap_or_else(|| panic!("{language}: no {path} in the recipe"));
            let spec: serde_json::Value = serde_json::from_slice(f.content).unwrap();
            assert!(
                spec["argv"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == "{connection_file}"))
            );
        }
        assert!(
            config
                .default_contexts
                .iter()
                .all(|l| config.kernels.contains_key(l))
        );
        assert!(
            RECIPE
                .pip
                .is_some_and(|r| r.contains("ipykernel==") && r.contains("e2b-charts=="))
        );
    }
}
