//! Template builds (e2b's `Template.build`) through the gateway's build API, as the SDKs call
//! it: a 5-step build from `base` cold (every step runs) and rebuilt unchanged (every step
//! from the cache), what the built template adds on disk over its parent against what its
//! steps wrote, and a create from a template whose start command must answer first.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::claims::e2b_kill;
use crate::commands::e2b_create_of;
use crate::common::*;

const KEY: &str = "e2b_bench";
/// What the RUN step writes: 20 MiB of random bytes.
const WRITTEN_MIB: u64 = 20;
/// What the COPY step uploads: 1 MiB of random bytes.
const COPIED_MIB: u64 = 1;

pub struct TemplateBuildBench {
    measured: chrono::DateTime<chrono::Utc>,
    cold: Summary,
    rebuilt: Summary,
    layer_bytes: u64,
    parent_bytes: u64,
    /// Creates that find the template's warm pool filled.
    pooled: Summary,
    /// Creates with no pool (no internet: a key no pool holds), the start command awaited.
    with_start: Summary,
    plain: Summary,
    /// The same cold and cached builds on a gVisor node, when runsc is installed.
    gvisor: Option<(Summary, Summary)>,
}

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<serde_json::Value>,
) -> Res<serde_json::Value> {
    let mut r = http.request(method, url).header("X-API-KEY", KEY);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let res = r.send().await?;
    let status = res.status();
    let text = res.text().await?;
    if !status.is_success() {
        return Err(format!("{url} answered {status}: {text}").into());
    }
    Ok(serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}

/// One build as the SDK runs it: request, the COPY's file check and upload, start, poll every
/// 200 ms until the end. Answers the template id.
async fn build(
    http: &reqwest::Client,
    url: &str,
    alias: &str,
    archive: &[u8],
    spec: serde_json::Value,
) -> Res<String> {
    let made = call(
        http,
        reqwest::Method::POST,
        &format!("{url}/v3/templates"),
        Some(serde_json::json!({"name": alias})),
    )
    .await?;
    let tid = made["templateID"]
        .as_str()
        .ok_or("no templateID")?
        .to_string();
    let bid = made["buildID"].as_str().ok_or("no buildID")?.to_string();
    let hash: String = Sha256::digest(archive)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let files = call(
        http,
        reqwest::Method::GET,
        &format!("{url}/templates/{tid}/files/{hash}"),
        None,
    )
    .await?;
    if files["present"] != true {
        let put = files["url"].as_str().ok_or("no upload url")?;
        let res = http.put(put).body(archive.to_vec()).send().await?;
        if !res.status().is_success() {
            return Err(format!("the upload answered {}", res.status()).into());
        }
    }
    let mut spec = spec;
    spec["steps"][0]["filesHash"] = serde_json::Value::from(hash);
    call(
        http,
        reqwest::Method::POST,
        &format!("{url}/v2/templates/{tid}/builds/{bid}"),
        Some(spec),
    )
    .await?;
    loop {
        let s = call(
            http,
            reqwest::Method::GET,
            &format!("{url}/templates/{tid}/builds/{bid}/status?logsOffset=0&limit=100"),
            None,
        )
        .await?;
        match s["status"].as_str() {
            Some("ready") => return Ok(tid),
            Some("error") => return Err(format!("the build failed: {}", s["reason"]).into()),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A gzip tar holding `app/data.bin` of `mib` random MiB, as the SDK's COPY uploads it.
fn archive(mib: u64) -> Res<Vec<u8>> {
    let data: Vec<u8> = (0..mib << 20).map(|_| rand::random::<u8>()).collect();
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    tar.append_data(&mut h, "app/data.bin", &data[..])?;
    let mut gz = tar.into_inner()?;
    gz.flush()?;
    Ok(gz.finish()?)
}

fn five_steps(nonce: &str) -> serde_json::Value {
    serde_json::json!({
        "fromTemplate": "base",
        "force": false,
        "steps": [
            {"type": "COPY", "args": ["app", "/home/user/app", "", ""]},
            {"type": "RUN", "args": [format!("head -c {}M /dev/urandom > /home/user/blob # {nonce}", WRITTEN_MIB)]},
            {"type": "ENV", "args": ["MODE", "bench"]},
            {"type": "WORKDIR", "args": ["/home/user/app"]},
            {"type": "RUN", "args": ["echo done > /home/user/app/done", "root"]},
        ],
    })
}

/// `runs` cold builds of the five steps, each followed by the same build again (cached):
/// their times, and the last template's id.
async fn cold_and_rebuilt(
    http: &reqwest::Client,
    url: &str,
    data: &[u8],
    runs: usize,
) -> Res<(Vec<Duration>, Vec<Duration>, String)> {
    let (mut cold, mut rebuilt) = (Vec::new(), Vec::new());
    let mut last = String::new();
    for i in 0..runs {
        // A new nonce: nothing of the chain after the COPY is cached.
        let alias = format!("bench-{i}-{}", rand::random::<u32>());
        let spec = five_steps(&alias);
        let t = Instant::now();
        last = build(http, url, &alias, data, spec.clone()).await?;
        cold.push(t.elapsed());
        let t = Instant::now();
        build(http, url, &alias, data, spec).await?;
        rebuilt.push(t.elapsed());
    }
    Ok((cold, rebuilt, last))
}

pub async fn bench(samples: usize) -> Res<TemplateBuildBench> {
    let gw = Daemon::gateway_with(&["base/egress=1".to_string()], &[])?;
    let http = reqwest::Client::new();
    let url = gw.address.clone();
    let data = archive(COPIED_MIB)?;
    let runs = samples.clamp(3, 10);

    let (cold, rebuilt, last) = cold_and_rebuilt(&http, &url, &data, runs).await?;
    eprintln!("  builds measured");

    // What the last template adds over base: its layers, from the listing.
    let listed = call(
        &http,
        reqwest::Method::GET,
        &format!("{url}/templates"),
        None,
    )
    .await?;
    let size_of = |id: &str| {
        listed
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["templateID"] == id)
            .and_then(|t| t["sizeBytes"].as_u64())
            .unwrap_or(0)
    };
    let layer_bytes = size_of(&last);
    let parent_bytes = size_of("base");

    // A create from a template with a start command, against one without.
    let server = serde_json::json!({
        "fromTemplate": "base",
        "steps": [{"type": "RUN", "args": ["true"]}],
        "startCmd": "python3 -m http.server 8000",
        "readyCmd": "[ -n \"$(ss -Htuln sport = :8000)\" ]",
    });
    let plain_spec =
        serde_json::json!({"fromTemplate": "base", "steps": [{"type": "RUN", "args": ["true"]}]});
    // The COPY-free specs carry no filesHash; `build` sets one on step 0, which RUN ignores.
    let with_server = build(&http, &url, "bench-server", &data, server).await?;
    let plain_tpl = build(&http, &url, "bench-plain", &data, plain_spec).await?;
    let (mut pooled, mut with_start, mut plain) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        // The pool of the template's default build, filled again after each claim.
        crate::claims::wait_pool_warm(
            &http,
            &url,
            &format!("{with_server}."),
            1,
            Duration::from_secs(120),
        )
        .await?;
        let t = Instant::now();
        let sb = e2b_create_of(&http, &url, &with_server).await?;
        pooled.push(t.elapsed());
        e2b_kill(&http, &url, &sb.id).await?;
        let t = Instant::now();
        let id = create_offline(&http, &url, &with_server).await?;
        with_start.push(t.elapsed());
        e2b_kill(&http, &url, &id).await?;
        let t = Instant::now();
        let sb = e2b_create_of(&http, &url, &plain_tpl).await?;
        plain.push(t.elapsed());
        e2b_kill(&http, &url, &sb.id).await?;
    }
    delete_ours(&http, &url).await?;
    gw.stop();

    let gvisor = match Daemon::gateway_with(
        &["base/egress=1".to_string()],
        &["--runtime".to_string(), "gvisor".to_string()],
    ) {
        Ok(gv) => {
            // The node is up, and known to the gateway, once its pool has a sandbox.
            crate::claims::wait_pool_warm(&http, &gv.address, "base/", 1, Duration::from_secs(120))
                .await?;
            let (cold, rebuilt, _) = cold_and_rebuilt(&http, &gv.address, &data, runs).await?;
            delete_ours(&http, &gv.address).await?;
            gv.stop();
            eprintln!("  builds on gVisor measured");
            Some((summarize(cold), summarize(rebuilt)))
        }
        Err(e) => {
            eprintln!("  no gVisor node ({e}); its builds are not measured");
            None
        }
    };
    Ok(TemplateBuildBench {
        measured: chrono::Utc::now(),
        cold: summarize(cold),
        rebuilt: summarize(rebuilt),
        layer_bytes,
        parent_bytes,
        pooled: summarize(pooled),
        with_start: summarize(with_start),
        plain: summarize(plain),
        gvisor,
    })
}

/// Deletes every template this bench built (their aliases start with `bench-`): the templates
/// directory is the tests' own, and a built template with a start command would otherwise
/// get a warm pool on every node started with it afterwards.
async fn delete_ours(http: &reqwest::Client, url: &str) -> Res<()> {
    let listed = call(
        http,
        reqwest::Method::GET,
        &format!("{url}/templates"),
        None,
    )
    .await?;
    for t in listed.as_array().into_iter().flatten() {
        let ours = t["aliases"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|a| a.as_str().is_some_and(|a| a.starts_with("bench-")));
        if let (true, Some(id)) = (ours, t["templateID"].as_str()) {
            call(
                http,
                reqwest::Method::DELETE,
                &format!("{url}/templates/{id}"),
                None,
            )
            .await?;
        }
    }
    Ok(())
}

/// A create without internet access: its key (`none` net) has no pool, so the sandbox boots
/// and its start command is awaited. Answers the sandbox id.
async fn create_offline(http: &reqwest::Client, url: &str, template: &str) -> Res<String> {
    let made = call(
        http,
        reqwest::Method::POST,
        &format!("{url}/v2/sandboxes"),
        Some(serde_json::json!({"templateID": template, "timeout": 600, "allowInternetAccess": false})),
    )
    .await?;
    Ok(made["sandboxID"]
        .as_str()
        .ok_or_else(|| format!("the create answered {made}"))?
        .to_string())
}

pub fn render(o: &mut String, b: &TemplateBuildBench) {
    let _ = writeln!(o, "## Template builds\n");
    let _ = writeln!(
        o,
        "Measured {} (`--only template-builds` adds this section to a file made before it).\n",
        b.measured.format("%Y-%m-%d %H:%M UTC")
    );
    let _ = writeln!(
        o,
        "Method: a gateway with its embedded node (built-in runtime) and the build API called as \
         the e2b SDKs call it (request, file check and upload, start, status every 200 ms until \
         it ends). The template is 5 steps from `base`: COPY of a {COPIED_MIB} MiB file, RUN \
         writing {WRITTEN_MIB} MiB, ENV, WORKDIR, RUN as root. Cold: a new name and a new \
         command, so every step runs (the upload is already stored after the first run). \
         Rebuilt: the same build again, every step from the team's cache (finalize still runs, \
         as upstream). Creates: `POST /v2/sandboxes` from a built template with a start command \
         (`python3 -m http.server 8000`, ready when `ss` sees the port): from its warm pool \
         (`--built-template-pool 1`, waited for before each create), and without internet \
         access (a key no pool holds, so it boots and the start command is awaited); against a \
         template without one (no pool: it boots). The gVisor rows: the same builds on a second \
         gateway whose node runs `--runtime gvisor` (each step a runsc sandbox over an \
         id-mapped overlay with its own disk, see README).\n"
    );
    let _ = writeln!(
        o,
        "| measure | samples | p50 | p90 | p99 |\n|---|---|---|---|---|"
    );
    summary_row(o, "5-step build from base, cold", &b.cold);
    summary_row(o, "the same build, unchanged (cached)", &b.rebuilt);
    summary_row(
        o,
        "create, template with a start command, from its warm pool (server answering)",
        &b.pooled,
    );
    summary_row(
        o,
        "create, template with a start command, booted (start command awaited)",
        &b.with_start,
    );
    summary_row(o, "create, template without one", &b.plain);
    if let Some((cold, rebuilt)) = &b.gvisor {
        summary_row(o, "5-step build from base, cold, on a gVisor node", cold);
        summary_row(
            o,
            "the same build, unchanged (cached), on a gVisor node",
            rebuilt,
        );
    }
    let _ = writeln!(
        o,
        "\nDisk: the built template adds {:.1} MiB over `base` ({:.1} MiB), for {} MiB its \
         steps wrote (the layers hold what each step wrote, nothing of the parent).\n",
        mib(b.layer_bytes),
        mib(b.parent_bytes),
        WRITTEN_MIB + COPIED_MIB
    );
    let _ = writeln!(
        o,
        "Targets: an unchanged rebuild within 1 s ({}), a layer costing only what its steps \
         wrote (above).\n",
        if b.rebuilt.p99 <= Duration::from_secs(1) {
            "met"
        } else {
            "missed"
        }
    );
}
