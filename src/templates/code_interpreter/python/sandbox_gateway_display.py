"""IPython extension: extra MIME types for the sandbox's code interpreter.

e2b/data         pandas DataFrame -> {column: [values...]}, JSON-safe (NaN/NaT -> null,
                 Timestamps -> ISO 8601 strings)
e2b/chart        matplotlib Figure -> e2b_charts.chart_figure_to_dict(figure)
application/json dict and list results, made JSON-safe with orjson (NaN -> null, numpy
                 scalars and arrays -> numbers and lists)
PIL              Image.show() displays the image; Image.save(path) displays it too.

DataFrames are registered by name (for_type_by_name) and Figures matched through
sys.modules, so neither pandas nor matplotlib is imported when the kernel starts.
"""
import datetime
import sys
import warnings

from IPython.core.formatters import BaseFormatter
from traitlets import ObjectName, Unicode


def _orjson_safe(obj):
    import orjson

    def default(o):
        pd = sys.modules.get("pandas")
        if pd is not None and (o is pd.NaT or o is pd.NA):
            return None
        if isinstance(o, (datetime.datetime, datetime.date, datetime.time)):
            return o.isoformat()
        if hasattr(o, "isoformat"):  # pandas Timestamp / Timedelta
            return o.isoformat()
        if hasattr(o, "tolist"):  # numpy types orjson does not take natively
            return o.tolist()
        return str(o)

    opts = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
    return orjson.loads(orjson.dumps(obj, default=default, option=opts))


def _dataframe_data(df):
    return _orjson_safe(df.to_dict(orient="list"))


def _figure_chart(fig):
    from e2b_charts import chart_figure_to_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic serializer warnings would reach the user's stderr
        return _orjson_safe(chart_figure_to_dict(fig)) or None


def _json_result(obj):
    try:
        return _orjson_safe(obj)
    except Exception:
        return None


class DataFormatter(BaseFormatter):
    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict,)


class ChartFormatter(BaseFormatter):
    """Figures are matched in __call__, not through type printers: IPython's
    pylabtools.select_figure_formats() (run whenever the inline backend is activated,
    e.g. on the first pyplot import) pops Figure from every formatter's printers."""

    format_type = Unicode("e2b/chart")
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict,)

    def __call__(self, obj):
        mpl_figure = sys.modules.get("matplotlib.figure")
        if mpl_figure is not None and isinstance(obj, mpl_figure.Figure):
            try:
                return _figure_chart(obj)
            except Exception:  # never break the figure's other outputs
                return None
        return super().__call__(obj)


def _patch_pil():
    """Image.show() displays the image (there is no viewer in a sandbox); Image.save(path)
    displays it as well. PIL.Image itself is cheap to import (~15 ms); PIL.ImageShow is not."""
    try:
        from PIL import Image
    except ImportError:
        return
    from IPython.display import display

    def show(self, title=None):
        display(self)

    orig_save = Image.Image.save

    def save(self, fp, format=None, **params):
        if isinstance(fp, str):
            display(self)
        return orig_save(self, fp, format, **params)

    Image.Image.show = show
    Image.Image.save = save


def load_ipython_extension(ip):
    fmt = ip.display_formatter
    data = DataFormatter(parent=fmt)
    data.for_type_by_name("pandas.core.frame", "DataFrame", _dataframe_data)
    fmt.formatters["e2b/data"] = data
    chart = ChartFormatter(parent=fmt)
    fmt.formatters["e2b/chart"] = chart
    js = fmt.formatters["application/json"]
    js.for_type(dict, _json_result)
    js.for_type(list, _json_result)
    _patch_pil()
