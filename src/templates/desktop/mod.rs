//! The `desktop` recipe: `base` plus what e2b's computer-use SDKs (`@e2b/desktop`,
//! `e2b_desktop`) run inside a sandbox: an X server (Xvfb), the Xfce desktop, xdotool for the
//! mouse and keyboard, scrot for screenshots, x11vnc with noVNC for the stream, the tools the
//! SDKs poll with (xdpyinfo, xrandr, netstat, pgrep), xdg-open and gtk-launch, and Firefox.
//! The SDKs start each of these themselves with commands; the template only has to hold them
//! where they look (`/opt/noVNC`).

use super::derive::File;
use super::recipes::Recipe;

/// The X server blanks an idle screen after ten minutes (and the SDKs start Xvfb with its
/// defaults): the session turns that off when it starts, so screenshots show the desktop.
const FILES: &[File] = &[File {
    path: "/etc/xdg/autostart/sandbox-no-blanking.desktop",
    content: include_bytes!("no-blanking.desktop"),
    mode: 0o644,
}];

/// noVNC where the SDKs start it from (`cd /opt/noVNC/utils && ./novnc_proxy … --web
/// /opt/noVNC`); Debian's `novnc_proxy` runs Debian's `websockify`. A desktop file for
/// Firefox under the name the SDKs' examples launch (`firefox`).
const COMMANDS: &[&str] = &[
    "ln -sfn /usr/share/novnc /opt/noVNC",
    "test -x /opt/noVNC/utils/novnc_proxy && test -f /opt/noVNC/vnc.html",
    "test -f /usr/share/applications/firefox.desktop || ln -s firefox-esr.desktop /usr/share/applications/firefox.desktop",
    "ln -sf /usr/bin/firefox-esr /usr/local/bin/firefox",
];

pub const RECIPE: Recipe = Recipe {
    name: "desktop",
    aliases: &[],
    from: "base",
    apt: &[
        "xvfb",
        "xauth",
        "x11-utils",
        "x11-xserver-utils",
        "xfce4",
        "xfce4-terminal",
        "dbus-x11",
        "at-spi2-core",
        "xdotool",
        "scrot",
        "xclip",
        "x11vnc",
        "novnc",
        "websockify",
        "net-tools",
        "procps",
        "libgtk-3-bin",
        "xdg-utils",
        "firefox-esr",
        "fonts-dejavu-core",
        "fonts-liberation2",
        "adwaita-icon-theme",
    ],
    pip: None,
    files: FILES,
    commands: COMMANDS,
    services: &[],
    // An X server, a desktop session and Firefox (near 1 GiB by itself with a page open) want
    // more than the smaller tiers' 512 MiB and 1 GiB.
    size: Some("large"),
    note: "the desktop template (Xvfb, Xfce, x11vnc with noVNC, xdotool, scrot, Firefox) downloads about 200 MB and takes a few minutes to build",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_desktop_has_what_the_sdks_run() {
        // e2b_desktop 2.7.2 runs these programs by name; each comes from one of the packages.
        for pkg in [
            "xvfb",              // Xvfb
            "x11-utils",         // xdpyinfo
            "xfce4",             // startxfce4, xfce4-session, xfwm4, xfdesktop
            "xdotool",           // every mouse and keyboard action
            "scrot",             // screenshot()
            "x11vnc",            // stream.start()
            "novnc",             // /opt/noVNC
            "websockify",        // novnc_proxy's bridge
            "net-tools",         // netstat, which stream.start() polls
            "x11-xserver-utils", // xrandr, get_screen_size()
            "libgtk-3-bin",      // gtk-launch, launch()
            "xdg-utils",         // xdg-open, open()
        ] {
            assert!(RECIPE.apt.contains(&pkg), "{pkg}");
        }
        assert!(super::super::recipes::find("desktop").is_some());
    }
}
