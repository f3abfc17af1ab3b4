# The report: renders every result that exists into one self-contained HTML file.
REPORT_HTML = "results/report/report.html"


rule report:
    input:
        results=STAGE_RESULTS,
        code=stage_code("report"),
    output:
        html=report(REPORT_HTML, caption="../report/report.rst", category="Report"),
    params:
        title=config["report"]["title"],
    log:
        "results/logs/report/report.log",
    shell:
        "{PY} {SCRIPTS}/report.py --results-dir results --inputs {input.results} "
        "--title {params.title:q} --out {output.html} 2>&1 | tee {log}"
