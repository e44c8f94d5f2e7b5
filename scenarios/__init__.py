"""LoadGen glue: the query sample library, the SUT adapter, scenario settings and the watchdog."""
