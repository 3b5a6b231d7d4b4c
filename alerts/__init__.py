"""Alert rules, their evaluation and lifecycle, and chat notifiers: data in, decisions out."""
