// MathJax 3, served by this site (javascripts/mathjax/, copied from the npm package at build
// time), so math renders without a network. Two sources of math, and nothing else is read:
// - Markdown pages: pymdownx.arithmatex (generic mode) wraps math in .arithmatex elements
//   with \(...\) and \[...\] delimiters;
// - notebook pages (mkdocs-jupyter): markdown cells (.jp-RenderedMarkdown) keep $...$ and
//   $$...$$. Code and outputs are skipped (MathJax never reads <pre> or <code>).
const MATH_CONTAINERS = [".arithmatex", ".jp-RenderedMarkdown"];

window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"], ["$", "$"]],
    displayMath: [["\\[", "\\]"], ["$$", "$$"]],
    processEscapes: true,
    processEnvironments: true,
  },
  startup: {
    elements: MATH_CONTAINERS,
  },
};

// Material's instant navigation swaps the page content without a reload: typeset the new
// content. The first page is MathJax's own start-up's; typesetting it again after
// clearCache() would drop the glyph styles of the math already on it (blank formulas).
let firstPage = true;
document$.subscribe(() => {
  if (firstPage) {
    firstPage = false;
    return;
  }
  MathJax.startup.promise.then(() => {
    MathJax.startup.output.clearCache();
    MathJax.typesetClear();
    MathJax.texReset();
    return MathJax.typesetPromise(document.querySelectorAll(MATH_CONTAINERS.join(", ")));
  });
});
