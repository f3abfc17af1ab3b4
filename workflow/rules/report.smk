# The paper-style report: every result rendered into one self-contained HTML file, its figures as
# PNGs (for `snakemake --report`), and a PDF printed by headless Chromium where Chromium is
# installed. A GPU node without Chromium still gets the HTML; asking it for the PDF says why not.
from gpulab import chromium as gpulab_chromium

REPORT_HTML = "results/report/report.html"
REPORT_PDF = "results/report/report.pdf"
REPORT_FIGURES = "results/report/figures"
REPORT_CHROMIUM = gpulab_chromium.find_chromium() if config["report"]["pdf"] else None
REPORT_NO_PDF = (
    "gpulab: no Chromium found, so results/report/report.pdf is not built (the HTML report is). "
    "Install it (Debian: apt-get install chromium) or point GPULAB_CHROMIUM at a Chromium binary."
    if config["report"]["pdf"] else
    "gpulab: report.pdf is false in the config, so results/report/report.pdf is not built."
)
if not REPORT_CHROMIUM and config["report"]["pdf"]:
    logger.warning(REPORT_NO_PDF)
# The report's code: its package, every stage's section, and all they import and read.
REPORT_CODE = report_code()


rule report:
    input:
        results=STAGE_RESULTS,
        code=REPORT_CODE,
    output:
        html=report(REPORT_HTML, caption="../report/report.rst", category="Report"),
        figures=report(directory(REPORT_FIGURES), patterns=["{name}.png"],
                       caption="../report/figures.rst", category="Figures"),
        # The PDF is an output only where it can be built.
        **({"pdf": report(REPORT_PDF, caption="../report/report_pdf.rst", category="Report")}
           if REPORT_CHROMIUM else {}),
    params:
        title=config["report"]["title"],
        pdf=lambda wildcards, output: f"--pdf {output.pdf}" if REPORT_CHROMIUM else "",
    log:
        "results/logs/report/report.log",
    shell:
        f"{PY} {SCRIPTS}/report.py --results-dir results --inputs {{input.results}} "
        "--title {params.title:q} --out {output.html} --figures-dir {output.figures} {params.pdf} "
        "2>&1 | tee {log}"


if not REPORT_CHROMIUM:

    rule report_pdf:
        output:
            REPORT_PDF,
        params:
            why=REPORT_NO_PDF,
        log:
            "results/logs/report/report_pdf.log",
        shell:
            "echo {params.why:q} | tee {log} >&2; exit 1"
