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
# Each stage's chapter is a fragment rendered by a job of its own from that stage's results, so a
# change to one stage re-renders one chapter; the report job assembles the fragments, the abstract
# and the chapters across stages (comparison, fleet, provenance). gpulab.workflow.fragment_plan: a
# fragment waits for every stage's results (never rendering beside a timing job), and reruns only
# when its own change.
REPORT_FRAGMENTS = "results/report/fragments"
REPORT_PLAN = gpulab_workflow.fragment_plan(STAGE_RESULTS, gpulab_stages.ORDER)
REPORT_STAGES = list(REPORT_PLAN)
# Code inputs, computed (gpulab.workflow.report_code): a fragment's reach its own section; the
# assembly's every stage's findings rules and no section (its fragments are inputs, always current).
REPORT_CODE = report_code(assembly=True)


rule report_fragment:
    input:
        results=lambda wc: REPORT_PLAN[wc.stage]["own"],
        after=lambda wc: [ancient(f) for f in REPORT_PLAN[wc.stage]["after"]],
        code=lambda wc: report_code([wc.stage]),
    output:
        f"{REPORT_FRAGMENTS}/{{stage}}.json",
    wildcard_constraints:
        stage="|".join(REPORT_STAGES),
    log:
        "results/logs/report/fragment-{stage}.log",
    shell:
        f"{PY} {SCRIPTS}/report.py --fragment {{wildcards.stage}} --results-dir results "
        "--inputs {input.results} --out {output} 2>&1 | tee {log}"


rule report:
    input:
        results=STAGE_RESULTS,
        fragments=expand(f"{REPORT_FRAGMENTS}/{{stage}}.json", stage=REPORT_STAGES),
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
        # From the inputs, not restated (Snakemake's lint: a hard-coded prefix of an input).
        fragments=lambda wildcards, input: os.path.dirname(input.fragments[0])
        if input.fragments else REPORT_FRAGMENTS,
    log:
        "results/logs/report/report.log",
    shell:
        f"{PY} {SCRIPTS}/report.py --results-dir results --inputs {{input.results}} "
        "--fragments-dir {params.fragments} --title {params.title:q} --out {output.html} "
        "--figures-dir {output.figures} {params.pdf} 2>&1 | tee {log}"


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
