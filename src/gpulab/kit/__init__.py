"""The report kit: what every report section builds with (:mod:`.html`: figures and tables numbered
across the report, notes, escaping; :mod:`.frames`: result tables collected across hosts, host
labels, checks sentences, reference rows, a headline's failure suffix).

It sits below the stages, whose ``section.py`` modules use it, and above nothing but
:mod:`gpulab.results` and :mod:`gpulab.outcomes` (tests/test_kit.py checks its imports); the report
package (``gpulab.report``) assembles the chapters around the sections.
"""
