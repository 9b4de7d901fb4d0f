"""The data path: raw formats -> Interactions -> preprocessing; the data set registry; synthetic data."""
