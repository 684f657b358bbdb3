//! `report html`: the page holds every chart and section, escapes what
//! records say, and renders in headless Chromium (screenshot saved).

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Charts the fixtures must give: collectives 2 per collective (all_reduce
/// over shm, tcp and escape; all_gather over shm) = 4; layers 2 per block
/// configuration (shm tiny, escape: stacked, and communication alone) = 4;
/// pipeline one bubble chart and 12 timelines (gpipe, 1f1b, zb-h1 at
/// M = 1, 2, 4, 8); capacity 1.
const CHARTS: usize = 4 + 4 + 1 + 12 + 1;

/// The report's sections, by their element id.
const SECTIONS: [&str; 6] = [
    "summary",
    "collectives",
    "layers",
    "pipeline",
    "capacity",
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
fn empty_sections_say_so() {
    let out = scratch("only-tcp").join("r.html");
    let html = render_to(&out, &[fixture("tcp")]);
    assert!(html.contains("No tensor-parallel layer measurements"));
    assert!(html.contains("No pipeline measurements"));
    // busbw + latency for all_reduce, and the capacity chart.
    assert_eq!(html.matches("<svg").count(), 3);
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

#[test]
fn renders_in_headless_chromium() {
    if !Path::new("/usr/bin/chromium").exists() {
        println!("SKIP renders_in_headless_chromium: /usr/bin/chromium is not installed (apt-get install chromium)");
        return;
    }
    let (out, _) = render("chromium");
    let url = format!("file://{}", out.display());
    let dir = out.parent().unwrap();

    // The DOM as the browser parsed it: every chart is an SVG element.
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
        "--window-size=1400,4000".to_string(),
        url,
    ]);
    chromium(&args, Duration::from_secs(60)).expect("chromium --screenshot finished within 60 s");
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        bytes.len() > 50_000,
        "a page with content, not a blank one ({} bytes)",
        bytes.len()
    );
    let _ = std::fs::remove_dir_all(dir.join("profile-dom"));
    let _ = std::fs::remove_dir_all(dir.join("profile-shot"));
    println!("screenshot: {}", png.display());
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
    // A real run's extra: many lines, a few in view and the rest folded.
    assert_lines_fold(&html);
    assert!(html.contains("<details><summary>"), "the rest folded");
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

/// The text of a chart's SVG `<text>` elements, joined by spaces (legend
/// labels wrap over several elements).
fn chart_text(html: &str, id: &str) -> String {
    let at = html.find(&format!("id=\"{id}\"")).unwrap();
    let chart = &html[at..];
    let chart = &chart[..chart.find("</svg>").unwrap()];
    let mut words = Vec::new();
    for part in chart.split("<text").skip(1) {
        if let Some(body) = part.split_once('>').map(|(_, b)| b) {
            words.push(
                body.split("</text>")
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_string(),
            );
        }
    }
    words.join(" ")
}

/// No lines cell shows more than six lines before the rest fold away.
fn assert_lines_fold(html: &str) {
    for cell in html.split("<td class=\"lines\">").skip(1) {
        let cell = &cell[..cell.find("</td>").unwrap()];
        let shown = cell.split("<details>").next().unwrap_or("");
        assert!(shown.matches("<div>").count() <= 6, "{cell}");
    }
}

fn html_of(dir: &Path) -> String {
    render_to(&dir.join("r.html"), &[dir.to_path_buf()])
}

#[test]
fn two_runs_of_one_key_are_two_curves_never_their_mean() {
    let html = html_of(&runs_folder("two-runs", 2));
    // Both runs named in the legend of the all_reduce chart and in the fit table.
    let chart = chart_text(&html, "busbw-all-reduce-float-sum");
    for t in ["00:00:00Z", "01:00:00Z"] {
        assert!(chart.contains(t), "run {t} has its own curve");
    }
    let measured = chart.matches("measured").count();
    assert_eq!(measured, 2, "two measured curves of one configuration");
    assert!(!html.contains("median of"), "two runs are not pooled");
    // The second run is marked noisy: in the legend and the runs table.
    assert!(chart.contains("NOISY"), "noisy curve marked");
    assert!(html.contains("<td class=\"bad\">NOISY: other processes took 30.0%"));
    // extra as key/value lines, not raw JSON; a few in view, the rest
    // folded, so that no run's row is taller than a screen.
    assert!(html.contains("<td class=\"lines\"><div>"), "extra as lines");
    assert_lines_fold(&html);
    assert!(!html.contains("{&quot;"), "no raw JSON object in the page");
    // Wide tables wrap on paper.
    assert!(html.contains("@media print") && html.contains(".scroll { overflow: visible; }"));
}

#[test]
fn more_runs_become_one_median_curve_with_its_band() {
    let html = html_of(&runs_folder("three-runs", 3));
    let at = html.find("id=\"busbw-all-reduce-float-sum\"").unwrap();
    let svg = &html[at..at + html[at..].find("</svg>").unwrap()];
    assert!(svg.contains("<polygon"), "its min..max band is drawn");
    let chart = chart_text(&html, "busbw-all-reduce-float-sum");
    assert!(
        chart.contains("median of 3 runs"),
        "labelled as a median: {chart}"
    );
    assert_eq!(chart.matches("measured").count(), 1);
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
        html.contains("the measured bubble PARTS from the simulation by up to")
            && html.contains("4 compute ranks on 2 cores"),
        "{html}"
    );
    assert!(html.contains("Conclude (pipeline): the most bubble is"));
}

/// The summary's all_reduce figure is the headline its run printed and
/// recorded (`extra.headlines`), word for word, not a peak computed again.
#[test]
fn the_summary_gives_the_runs_own_headline() {
    let dir = copy_fixture("shm", "html-headline");
    let path = dir.join("run.json");
    let mut runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let line = "all_reduce: peak busbw 8.9 GB/s at 2 MiB, out of place, 81% of the wire's ceiling";
    for run in runs.as_array_mut().unwrap() {
        run["extra"]["headlines"] = serde_json::json!([{
            "collective": "all_reduce", "bytes": 2097152, "in_place": false,
            "busbw_gbps": 8.90355, "ceiling_gbps": 11.0, "line": line,
        }]);
    }
    std::fs::write(&path, runs.to_string()).unwrap();
    let html = html_of(&dir);
    let summary = &html[html.find("<section id=\"summary\">").unwrap()..];
    let summary = &summary[..summary.find("</section>").unwrap()];
    assert!(summary.contains(&line.replace('\'', "&#39;")), "{summary}");
    assert_eq!(summary.matches("peak busbw").count(), 1, "{summary}");
}
