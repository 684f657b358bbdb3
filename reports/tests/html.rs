//! `report html`: the page holds every chart and section, escapes what
//! records say, and renders in headless Chromium (screenshot saved) at
//! 1280x800 and 1400 wide without overflow, legends over 6 entries or
//! empty sections.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Charts the fixtures must give: collectives 2 per collective (all_reduce
/// over shm, tcp and escape; all_gather over shm) = 4; layers 2 per block
/// configuration (shm tiny, escape: stacked, and communication alone) = 4;
/// pipeline one bubble chart and 12 timelines (gpipe, 1f1b, zb-h1 at
/// M = 1, 2, 4, 8); planning's tensor-parallel chart 1.
const CHARTS: usize = 4 + 4 + 1 + 12 + 1;

/// The report's sections, by their element id.
const SECTIONS: [&str; 6] = [
    "summary",
    "collectives",
    "layers",
    "pipeline",
    "plan",
    "runs",
];

/// `report html DIRS -o out`: asserts it succeeded; the page it wrote.
fn render_to(out: &Path, dirs: &[PathBuf]) -> String {
    let mut args = vec!["html".to_string()];
    args.extend(dirs.iter().map(|d| d.display().to_string()));
    args.extend(["--output-file".into(), out.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = report(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::read_to_string(out).unwrap()
}

/// The shm, tcp and escape fixtures rendered into a scratch folder.
fn render(name: &str) -> (PathBuf, String) {
    let out = scratch(name).join("report.html");
    let html = render_to(&out, &[fixture("shm"), fixture("tcp"), fixture("escape")]);
    (out, html)
}

#[test]
fn every_section_and_chart_is_there() {
    let (_, html) = render("sections");
    for id in SECTIONS {
        assert!(
            html.contains(&format!("<section id=\"{id}\">")),
            "section {id}"
        );
    }
    assert_eq!(html.matches("<svg").count(), CHARTS);
    assert_eq!(html.matches("<figure class=\"chart\"").count(), CHARTS);
    for id in [
        "busbw-all-reduce-float-sum",
        "latency-all-reduce-float-sum",
        "busbw-all-gather-float",
        "bubble-0",
        "capacity-chart",
    ] {
        assert!(html.contains(&format!("id=\"{id}\"")), "chart {id}");
    }
    // Readable size labels on the log2 axis.
    for label in ["8 B", "1 KiB", "1 MiB"] {
        assert!(html.contains(&format!(">\n{label}\n</text>")), "{label}");
    }
    // Self-contained: nothing fetched, no scripts.
    // (the SVG namespace URI is a name, not a fetch)
    for fetch in ["src=", "href=\"http", "url(", "@import"] {
        assert!(!html.contains(fetch), "nothing fetched: {fetch}");
    }
    assert!(
        !html.contains("<script"),
        "no script element, escaped labels only"
    );
    assert!(!html.contains("<link"));
}

#[test]
fn labels_from_records_are_escaped() {
    let (_, html) = render("escape");
    assert!(
        html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co"),
        "table cells"
    );
    // plotters escapes the chart texts its own way (&apos; or ').
    assert!(html.contains("&lt;script&gt;alert("), "chart legends");
    assert!(!html.contains("<script>"));
    assert!(!html.contains(" & co"), "a bare ampersand");
}

#[test]
fn a_section_with_nothing_to_show_is_left_out() {
    let out = scratch("only-tcp").join("r.html");
    let html = render_to(&out, &[fixture("tcp")]);
    for id in ["layers", "pipeline", "links", "cp-moe"] {
        assert!(!html.contains(&format!("id=\"{id}\"")), "no {id} section");
        assert!(
            !html.contains(&format!("href=\"#{id}\"")),
            "no {id} menu entry"
        );
    }
    assert!(!html.contains("class=\"empty\""), "no 'nothing here' note");
    // busbw + latency for all_reduce, and planning's tensor-parallel chart.
    assert_eq!(html.matches("<svg").count(), 3);
    // One planning section.
    assert_eq!(html.matches("href=\"#plan\"").count(), 1);
    assert!(!html.contains("Capacity planning"));
}

#[test]
fn an_existing_report_is_replaced_atomically() {
    let dir = scratch("overwrite");
    let out = dir.join("r.html");
    std::fs::write(&out, "<!DOCTYPE html>\n<p>last night's report</p>\n").unwrap();
    let html = render_to(&out, &[fixture("tcp")]);
    assert!(html.starts_with("<!DOCTYPE html>"));
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["r.html"], "no temporary file left");
}

/// Runs chromium with a deadline; None when it does not finish.
fn chromium(args: &[String], deadline: Duration) -> Option<std::process::Output> {
    let mut child = Command::new("/usr/bin/chromium")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let start = Instant::now();
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut buf).ok();
        buf
    });
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let out = reader.join().unwrap_or_default();
            return Some(std::process::Output {
                status,
                stdout: out,
                stderr: Vec::new(),
            });
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn browser_args(profile: &Path) -> Vec<String> {
    [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect()
}

/// The page's layout checks, run by Chromium in a copy of the page (the
/// report itself holds no script): the page wider than the window, a table
/// or figure wider than its section, a legend of more than 6 entries, a
/// section with nothing in it, a menu entry without its section. Writes
/// the verdict into `<pre id="verdict">`: the window's width, then one
/// line per failure, or nothing.
const LAYOUT_CHECKS: &str = r#"<script>
(function () {
  var out = ["width " + window.innerWidth];
  var de = document.documentElement;
  if (de.scrollWidth > de.clientWidth) {
    out.push("page overflows: scrollWidth " + de.scrollWidth + " > clientWidth " + de.clientWidth);
  }
  document.querySelectorAll("table, figure").forEach(function (el) {
    var box = el.closest("section") || document.body;
    var b = box.getBoundingClientRect(), cs = getComputedStyle(box);
    var right = b.right - parseFloat(cs.paddingRight) - parseFloat(cs.borderRightWidth);
    var r = el.getBoundingClientRect();
    if (r.right > right + 1) {
      out.push(el.tagName.toLowerCase() + " " + (el.id || (el.querySelector("th") || {}).textContent || "")
        + " in " + (box.id || "body") + " runs " + Math.round(r.right - right) + " px past its container");
    }
  });
  document.querySelectorAll("figure").forEach(function (f) {
    var n = f.querySelectorAll("div.legend li").length;
    if (n > 6) { out.push("legend of " + n + " entries: " + f.id); }
  });
  document.querySelectorAll("section").forEach(function (s) {
    if (!s.querySelector("table, figure, ul, ol")) { out.push("empty section: " + s.id); }
  });
  document.querySelectorAll("nav a").forEach(function (a) {
    if (!document.getElementById(a.getAttribute("href").slice(1))) {
      out.push("menu entry without its section: " + a.textContent);
    }
  });
  var pre = document.createElement("pre");
  pre.id = "verdict";
  pre.textContent = out.join("\n");
  document.body.appendChild(pre);
})();
</script>"#;

/// Chromium's verdict on `html` at a window `width` x `height`: its
/// failures (empty: none). Panics when Chromium gives no verdict or lays
/// the page out at another width.
fn layout_failures(html: &str, dir: &Path, width: u32, height: u32) -> Vec<String> {
    let page = dir.join(format!("checked-{width}.html"));
    let body_end = html.rfind("</body>").expect("a body");
    std::fs::write(
        &page,
        format!("{}{LAYOUT_CHECKS}{}", &html[..body_end], &html[body_end..]),
    )
    .unwrap();
    let profile = dir.join(format!("profile-{width}"));
    let mut args = browser_args(&profile);
    args.extend([
        format!("--window-size={width},{height}"),
        "--dump-dom".to_string(),
        format!("file://{}", page.display()),
    ]);
    let dom =
        chromium(&args, Duration::from_secs(90)).expect("chromium --dump-dom finished within 90 s");
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&dom.stdout);
    let at = dom.find("<pre id=\"verdict\">").unwrap_or_else(|| {
        panic!(
            "no verdict in Chromium's DOM: {}",
            &dom[..dom.len().min(400)]
        )
    });
    let verdict = &dom[at + "<pre id=\"verdict\">".len()..];
    let verdict = &verdict[..verdict.find("</pre>").unwrap()];
    let mut lines = verdict
        .lines()
        .map(|l| l.replace("&gt;", ">").replace("&amp;", "&"));
    assert_eq!(
        lines.next().as_deref(),
        Some(format!("width {width}").as_str()),
        "Chromium laid the page out at another width"
    );
    lines.collect()
}

/// Whether the rendering tests can run here; without Chromium they say so
/// (SKIP) and pass, except where PARBENCH_REQUIRE_CHROMIUM=1 (CI, which
/// installs it) makes a missing browser a failure.
fn have_chromium(test: &str) -> bool {
    if Path::new("/usr/bin/chromium").exists() {
        return true;
    }
    assert!(
        !std::env::var("PARBENCH_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1"),
        "{test}: /usr/bin/chromium is missing and PARBENCH_REQUIRE_CHROMIUM=1"
    );
    eprintln!("SKIP {test}: /usr/bin/chromium is not installed (apt-get install chromium)");
    false
}

#[test]
fn renders_in_headless_chromium() {
    if !have_chromium("renders_in_headless_chromium") {
        return;
    }
    let (out, _) = render("chromium");
    let url = format!("file://{}", out.display());
    let dir = out.parent().unwrap();

    // The DOM as the browser parsed it: every chart is a figure with its SVG.
    let mut args = browser_args(&dir.join("profile-dom"));
    args.extend(["--dump-dom".to_string(), url.clone()]);
    let dom =
        chromium(&args, Duration::from_secs(60)).expect("chromium --dump-dom finished within 60 s");
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert_eq!(
        dom.matches("<svg").count(),
        CHARTS,
        "charts in the browser's DOM"
    );
    for id in SECTIONS {
        assert!(
            dom.contains(&format!("id=\"{id}\"")),
            "section {id} in the DOM"
        );
    }
    assert!(!dom.contains("<script"), "no script element in the DOM");

    let png = Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-screenshot.png");
    let _ = std::fs::remove_file(&png);
    let mut args = browser_args(&dir.join("profile-shot"));
    args.extend([
        format!("--screenshot={}", png.display()),
        "--window-size=1280,800".to_string(),
        url,
    ]);
    chromium(&args, Duration::from_secs(60)).expect("chromium --screenshot finished within 60 s");
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        bytes.len() > 20_000,
        "a page with content, not a blank one ({} bytes)",
        bytes.len()
    );
    let _ = std::fs::remove_dir_all(dir.join("profile-dom"));
    let _ = std::fs::remove_dir_all(dir.join("profile-shot"));
    println!("screenshot: {}", png.display());
}

/// At 1280x800 and 1400 wide, the page of the fixtures (long labels from
/// the escape fixture, several wires, every section) and of real records
/// (the CP and MoE section's among them) fits the window: no overflow, no legend over 6 entries, no empty section.
#[test]
fn the_page_fits_the_window_in_chromium() {
    if !have_chromium("the_page_fits_the_window_in_chromium") {
        return;
    }
    let dir = scratch("fits");
    let pages = [
        (
            "fixtures",
            render_to(
                &dir.join("fixtures.html"),
                &[fixture("shm"), fixture("tcp"), fixture("escape")],
            ),
        ),
        (
            "real",
            render_to(
                &dir.join("real.html"),
                &[fixture("real-cpu"), fixture("real-tcp")],
            ),
        ),
        (
            "cp-moe",
            render_to(
                &dir.join("cp-moe.html"),
                &[fixture("real-cpu"), fixture("real-cp")],
            ),
        ),
    ];
    for (name, html) in &pages {
        for (w, h) in [(1280, 800), (1400, 900)] {
            let failures = layout_failures(html, &dir, w, h);
            assert!(failures.is_empty(), "{name} at {w}x{h}: {failures:#?}");
        }
    }
}

/// The checks can fail: a page with a table wider than the window, a
/// legend of 7 entries and an empty section is refused on each count.
#[test]
fn the_layout_checks_catch_overflow_legends_and_empty_sections() {
    if !have_chromium("the_layout_checks_catch_overflow_legends_and_empty_sections") {
        return;
    }
    let dir = scratch("fits-bad");
    let legend: String = (0..7).map(|i| format!("<li>curve {i}</li>")).collect();
    let html = format!(
        "<!DOCTYPE html><html><body><nav><a href=\"#a\">A</a><a href=\"#gone\">Gone</a></nav><main>\
         <section id=\"a\"><table><tr><td style=\"white-space: nowrap\">{}</td></tr></table>\
         <figure id=\"f\"><div class=\"legend\"><ul>{legend}</ul></div></figure></section>\
         <section id=\"b\"><h2>B</h2><p>nothing</p></section></main></body></html>",
        "wide ".repeat(400)
    );
    let failures = layout_failures(&html, &dir, 1280, 800).join("\n");
    for want in [
        "page overflows",
        "runs ",
        "legend of 7 entries: f",
        "empty section: b",
        "menu entry without its section: Gone",
    ] {
        assert!(failures.contains(want), "{want}: {failures}");
    }
}

#[test]
fn real_records_render() {
    // Records the real binaries wrote (fixtures/README.md): every chart
    // drawn, the collective and layer sections filled.
    let out = scratch("real").join("r.html");
    let html = render_to(&out, &[fixture("real-cpu"), fixture("real-tcp")]);
    assert!(!html.contains("Chart not drawn"), "every chart drawn");
    assert!(!html.contains("No collective measurements"));
    assert!(!html.contains("No tensor-parallel layer measurements"));
    assert!(html.contains("id=\"busbw-all-reduce-float-sum\""));
    assert!(html.contains("id=\"layers-comm-0\""));
    // What to conclude, and the caveat of 2-rank fits projected to TP 8.
    assert!(html.contains("Conclude (collectives): farthest below its ceiling"));
    assert!(
        html.contains("Caveat: ")
            && html.contains("measured fewer ranks than the degrees projected")
    );
    // A run is one line; its details (extra, versions) folded.
    assert_runs_fold(&html);
    // Two wires with all_reduce fits, plus the two references.
    assert!(
        html.contains("real-tcp: tcp/tcp"),
        "the tcp wire in the capacity table"
    );
}

/// A folder holding `runs` runs of the shm fixture's collectives (run i's
/// times scaled by 1 + i), each with its own run.json entry; run 1 noisy.
fn runs_folder(name: &str, runs: usize) -> PathBuf {
    rounds_folder(
        name,
        runs,
        |i, _| 1.0 + i as f64,
        |i| if i == 1 { 0.3 } else { 0.0 },
    )
}

/// A chart's legend entries (HTML above the chart), one string each.
fn legend(html: &str, id: &str) -> Vec<String> {
    let at = html.find(&format!("id=\"{id}\"")).unwrap();
    let chart = &html[at..];
    let chart = &chart[..chart.find("</figure>").unwrap()];
    let ul = &chart[chart.find("<ul>").unwrap()..chart.find("</ul>").unwrap()];
    ul.split("<li>")
        .skip(1)
        .map(|li| {
            let label = li.rsplit("<span>").next().unwrap_or("");
            label.split("</span>").next().unwrap_or("").to_string()
        })
        .collect()
}

/// Every Runs row is one line: its details are folded.
fn assert_runs_fold(html: &str) {
    let runs = &html[html.find("<section id=\"runs\">").unwrap()..];
    let runs = &runs[..runs.find("</section>").unwrap()];
    let rows = runs.matches("<tr>").count() - 1;
    assert!(rows > 0, "{runs}");
    assert_eq!(
        runs.matches("<details><summary>").count(),
        rows,
        "each run's details folded"
    );
    let shown: String = runs
        .split("<details>")
        .map(|p| p.split("</details>").last().unwrap_or(""))
        .collect();
    assert!(!shown.contains("command line:"), "details not in view");
}

fn html_of(dir: &Path) -> String {
    render_to(&dir.join("r.html"), &[dir.to_path_buf()])
}

#[test]
fn two_runs_of_one_key_are_two_curves_never_their_mean() {
    let html = html_of(&runs_folder("two-runs", 2));
    // Both runs named in the legend of the all_reduce chart, one entry each.
    let entries = legend(&html, "busbw-all-reduce-float-sum");
    assert_eq!(
        entries.len(),
        2,
        "two curves of one configuration: {entries:?}"
    );
    for t in ["00:00:00Z", "01:00:00Z"] {
        assert!(
            entries.iter().any(|e| e.contains(t)),
            "run {t} has its own curve"
        );
    }
    assert!(!html.contains("median of"), "two runs are not pooled");
    // The second run is marked noisy: in the legend and the runs table.
    assert!(
        entries.iter().any(|e| e.contains("NOISY")),
        "noisy curve marked"
    );
    assert!(html.contains("<td class=\"bad\">NOISY: 30.0%"));
    // extra as key/value lines, not raw JSON, folded so that a run is one line.
    assert_runs_fold(&html);
    assert!(!html.contains("{&quot;"), "no raw JSON object in the page");
    // Cells wrap: no table runs off the page, on screen or on paper.
    assert!(html.contains("@media print") && html.contains("overflow-wrap: anywhere"));
}

#[test]
fn more_runs_become_one_median_curve_with_its_band() {
    let html = html_of(&runs_folder("three-runs", 3));
    let at = html.find("id=\"busbw-all-reduce-float-sum\"").unwrap();
    let svg = &html[at..at + html[at..].find("</svg>").unwrap()];
    assert!(svg.contains("<polygon"), "its min..max band is drawn");
    let entries = legend(&html, "busbw-all-reduce-float-sum");
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(
        entries[0].contains("median of 3 runs"),
        "labelled as a median: {entries:?}"
    );
}

/// A measured bubble that parts from its simulation is said to part, with
/// its likely cause when the pipeline had more ranks than the run's cores.
#[test]
fn a_bubble_that_parts_from_its_simulation_is_named() {
    let dir = copy_fixture("shm", "html-bubble-parts");
    let path = dir.join("pipeline.csv");
    let mut rows: Vec<parbench::results::PipelineRow> =
        parbench::results::read_rows(&path).unwrap();
    rows[0].bubble_measured = (rows[0].bubble_simulated + 0.3).min(0.99);
    // Real work (not sleeps): four stage ranks need four cores.
    rows[0].work = "compute".into();
    std::fs::remove_file(&path).unwrap();
    parbench::results::append_rows(&dir, &rows).unwrap();
    let html = html_of(&dir);
    assert!(
        html.contains("the measured bubble parts from the simulation by up to")
            && html.contains("4 compute ranks on 2 cores"),
        "{html}"
    );
    assert!(html.contains("Conclude (pipeline): the most bubble is"));
}

/// The summary's all_reduce figure is the row of the headline its run
/// printed and recorded (`extra.headlines`), not a peak computed again.
#[test]
fn the_summary_gives_the_runs_own_headline() {
    let dir = copy_fixture("shm", "html-headline");
    let path = dir.join("run.json");
    let mut runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let line = "all_reduce: peak busbw 6.7 GB/s at 8 MiB, out of place, 61% of the wire's ceiling";
    for run in runs.as_array_mut().unwrap() {
        run["extra"]["headlines"] = serde_json::json!([{
            "collective": "all_reduce", "bytes": 8388608, "in_place": false,
            "busbw_gbps": 8.90355, "ceiling_gbps": 11.0, "line": line,
        }]);
    }
    std::fs::write(&path, runs.to_string()).unwrap();
    let html = html_of(&dir);
    let summary = &html[html.find("<section id=\"summary\">").unwrap()..];
    let summary = &summary[..summary.find("</section>").unwrap()];
    // The headline's row (8 MiB), not the sweep's best.
    let row = summary
        .split("<tr>")
        .find(|r| r.contains("all_reduce on"))
        .expect("an all_reduce answer");
    assert!(row.contains(" GB/s at 8 MiB"), "{row}");
    assert!(!summary.contains("fitted alpha"), "{summary}");
}

/// The body of the section `id` (empty when there is none).
fn section_of<'a>(html: &'a str, id: &str) -> &'a str {
    let Some(at) = html.find(&format!("<section id=\"{id}\">")) else {
        return "";
    };
    let rest = &html[at..];
    &rest[..rest.find("</section>").unwrap_or(rest.len())]
}

#[test]
fn context_parallel_and_moe_records_have_their_section() {
    // Real runs of bench-layers --cp, --experts and bench-collectives
    // moe and cp-ring (fixtures/README.md).
    let out = scratch("cp-moe").join("r.html");
    let html = render_to(&out, &[fixture("real-cp")]);
    let sec = section_of(&html, "cp-moe");
    assert!(html.contains("href=\"#cp-moe\""), "menu entry");
    for part in [
        "Context-parallel attention: real-cp: local/shm forward causal",
        "MoE block: real-cp:",
        "MoE dispatch and combine: real-cp: local/shm, 2 ranks, 64 tokens a rank x hidden 64",
        "CP ring beside compute: real-cp: local/shm, 2 ranks",
    ] {
        assert!(sec.contains(part), "{part}: {sec}");
    }
    // Each figure beside its reference: cp 1, the unsplit layout, the model.
    assert!(sec.contains("x of 33.5 us"), "cp 2 against cp 1: {sec}");
    assert!(sec.contains("x of 77.5 us"), "ep 2 against ep 1: {sec}");
    assert!(
        sec.contains("(model 1.68 us)"),
        "the all-to-all's model: {sec}"
    );
    assert!(
        sec.contains("<td>1.39 us</td><td>0.75 us</td><td>5.09 of 66.6</td>"),
        "dispatch beside the model and the ceiling: {sec}"
    );
    assert!(sec.contains("<td>16 KiB</td><td>93.8%</td><td>111 us</td><td>111 us</td>"));
    // The answers table: the ring's share hidden at its largest size.
    let summary = section_of(&html, "summary");
    assert!(
        summary.contains("CP ring: share hidden")
            && summary.contains("93.8% hidden at 16 KiB")
            && summary.contains("exchange alone 111 us, model 111 us"),
        "{summary}"
    );
}

#[test]
fn an_moe_block_run_alone_is_a_results_folder() {
    // bench-layers --experts writes run.json and no CSV.
    let dir = scratch("moe-only");
    std::fs::copy(fixture("real-cp").join("run.json"), dir.join("run.json")).unwrap();
    let html = html_of(&dir);
    let sec = section_of(&html, "cp-moe");
    assert!(sec.contains("MoE block:"), "{sec}");
    for absent in [
        "Context-parallel attention:",
        "CP ring beside",
        "MoE dispatch",
    ] {
        assert!(!sec.contains(absent), "{absent}: {sec}");
    }
}
