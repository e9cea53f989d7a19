"""Planning: `policy` chooses each step's tree from measured costs and calibrated acceptance, `step_arms` checks it
against the whole tree, `calibration` / `measured` / `learned` measure the target's costs and keep what calls learned."""
