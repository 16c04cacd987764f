//! Layers: immutable directories in overlay upper format that templates stack over a root.
