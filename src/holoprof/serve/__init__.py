"""The live side of holoprof: on-demand requests (``holoprof ctl``) and the dashboard (``holoprof serve``)."""
