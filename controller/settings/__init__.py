"""Leaves every settings parser builds on: fields.py, the field checks shared by the job file's and
the config file's parsers (each naming the dotted field it refuses), and the config sections that no
package importing the config may own (packing.py). Nothing here imports the rest of the controller
(only the standard library, yaml and contract/), so config.py and every package can import it
without a cycle."""
