"""Files advcal reads and writes: calibration artefacts (``advcal.io.artefacts``) and reward
logs (``advcal.io.logs``), each above the science it stores."""
