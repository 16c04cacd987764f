//! Uploaded COPY archives: checked before they are stored.
