//! Template builds from the e2b SDKs (build system 2.0): the uploaded files, the steps and
//! their cache, run in real sandboxes on a node and committed as layers over the parent.

pub mod archive;
pub mod steps;
