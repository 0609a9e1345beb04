"""``faust -A streamapp.app worker -l info``: the worker of the stages named in STREAMAPP_STAGES."""

from streamapp.worker.factory import create_app_or_exit

app = create_app_or_exit()
